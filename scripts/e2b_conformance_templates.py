#!/usr/bin/env python3
"""Template builds through the official E2B Python SDK against the wmo-e2b emulator.

Run by scripts/conformance.sh with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL naming an
emulator whose image settings send `docker.io` to a loopback registry holding a small
`library/ubuntu:22.04` (busybox, made by conformance.sh). Prints one line per check and
`N passed, M failed` last; exits non-zero on any failure.
"""

import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

from e2b import Sandbox, Template
from e2b.exceptions import BuildException, SandboxException

import e2b_checks
from e2b_checks import RUN, case, check, equal, raises

CONTEXT = tempfile.mkdtemp(prefix="wmo-e2b-template-")
NAME = f"wmo-check-{RUN}"


def setup_context():
    folder = os.path.join(CONTEXT, "folder")
    os.makedirs(folder)
    with open(os.path.join(folder, "test.txt"), "w") as f:
        f.write("This is a test file.")
    os.symlink("test.txt", os.path.join(folder, "link.txt"))


def template():
    return (
        Template(file_context_path=CONTEXT)
        .from_image("ubuntu:22.04")
        .copy("folder/*", "folder")
        .run_cmd("cat folder/test.txt")
        .run_cmd(f"echo {RUN} > /run-id")
        .set_envs({"GREETING": "hello $HOME"})
        .run_cmd('mkdir -p /app && echo "built with $GREETING" > /app/marker')
        .set_workdir("/app")
    )


def test_exists():
    check("base exists", Template.exists("base") is True)
    check("a free name does not", Template.exists(f"free-{RUN}") is False)


def test_build_and_run():
    logs = []
    info = Template.build(template(), NAME, on_build_logs=logs.append)
    check("build returns its template id", bool(info.template_id), info)
    text = "\n".join(entry.message for entry in logs)
    check("the build's own output reaches the logs", "This is a test file." in text, text[-2000:])
    check("the name exists once built", Template.exists(NAME) is True)
    sbx = Sandbox.create(NAME, timeout=120)
    try:
        equal("a RUN step's file is in the sandbox",
              sbx.commands.run("cat /app/marker").stdout, "built with hello $HOME\n")
        equal("a COPY step's file is in the sandbox",
              sbx.commands.run("cat /folder/test.txt").stdout, "This is a test file.")
        equal("a copied symlink reads as its target",
              sbx.commands.run("cat /folder/link.txt").stdout, "This is a test file.")
        equal("the image's system is the sandbox's",
              sbx.commands.run("readlink /bin/sh").stdout, "busybox\n")
        base = Sandbox.create("base", timeout=60)
        try:
            equal("the base template's sandbox is not on the image",
                  base.commands.run("test -e /app/marker || echo host").stdout, "host\n")
        finally:
            base.kill()
    finally:
        sbx.kill()


def test_same_content_is_not_built_again():
    logs = []
    Template.build(template(), NAME, on_build_logs=logs.append)
    text = "\n".join(entry.message for entry in logs)
    check("an uploaded file is not uploaded again", "already cached" in text, text[-2000:])
    check("the same content is not built again", "Cached: built before" in text, text[-2000:])


def test_tags():
    tagged = Template().from_image("ubuntu:22.04").run_cmd("echo v2 > /version")
    # Built first under the tag alone: the name without a tag still names the first build.
    Template.build(tagged, f"{NAME}:v2")
    sbx = Sandbox.create(f"{NAME}:v2", timeout=60)
    try:
        equal("a tag names its own build", sbx.commands.run("cat /version").stdout, "v2\n")
    finally:
        sbx.kill()


def test_from_template():
    child = Template().from_template(NAME).run_cmd("echo child >> /app/marker")
    Template.build(child, f"{NAME}-child")
    sbx = Sandbox.create(f"{NAME}-child", timeout=60)
    try:
        equal("a template built from another has both's steps",
              sbx.commands.run("cat /app/marker").stdout, "built with hello $HOME\nchild\n")
    finally:
        sbx.kill()


def test_failing_step():
    failing = Template().from_image("ubuntu:22.04").run_cmd("echo about to fail; exit 3")
    err = raises("a failing RUN fails the build", BuildException,
                 lambda: Template.build(failing, f"{NAME}-fails"))
    check("the reason names the step's command", err is not None and "exit 3" in str(err), err)
    raises("a template with no finished build makes no sandbox", SandboxException,
           lambda: Sandbox.create(f"{NAME}-fails", timeout=60))


def test_unknown_base_image():
    missing = Template().from_image("no-such-image-anywhere:1")
    raises("a base image no registry has fails the build", BuildException,
           lambda: Template.build(missing, f"{NAME}-nobase"))


def test_background_build_status():
    slow = Template().from_image("ubuntu:22.04").skip_cache().run_cmd(f"sleep 2; echo {RUN}-slow")
    info = Template.build_in_background(slow, f"{NAME}-bg")
    status = Template.get_build_status(info)
    check("a background build is building at first", status.status.value == "building", status)
    deadline = time.monotonic() + 120
    while status.status.value == "building" and time.monotonic() < deadline:
        time.sleep(0.5)
        status = Template.get_build_status(info)
    equal("a background build ends ready", status.status.value, "ready")


def test_builds_at_once_are_bounded():
    # The emulator runs with --max-builds 2: a third build while two run is refused.
    slow = [Template().from_image("ubuntu:22.04").run_cmd(f"sleep 3; echo {RUN}-{i}")
            for i in range(3)]
    started = [Template.build_in_background(slow[i], f"{NAME}-busy{i}") for i in range(2)]
    err = raises("a build past --max-builds is refused", Exception,
                 lambda: Template.build_in_background(slow[2], f"{NAME}-busy2"))
    check("the refusal is a 429 naming the bound",
          err is not None and "429" in str(err) and "--max-builds" in str(err), err)
    for info in started:
        deadline = time.monotonic() + 120
        while Template.get_build_status(info).status.value == "building":
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    Template.build_in_background(slow[2], f"{NAME}-busy2")
    check("a place frees when a build ends", True)


def test_upload_needs_its_signature():
    url = os.environ["E2B_API_URL"]
    forged = f"{url}/_emulator/template-files/{'0' * 64}?signature=forged"
    req = urllib.request.Request(forged, data=b"x", method="PUT")
    try:
        urllib.request.urlopen(req, timeout=10)
        status = 200
    except urllib.error.HTTPError as e:
        status = e.code
    equal("an upload with a forged signature is refused", status, 403)


def api(method, path, body=None):
    """A raw API call, for what the SDK would never send; (status, parsed body)."""
    url = os.environ["E2B_API_URL"] + path
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"X-API-Key": os.environ["E2B_API_KEY"],
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def hostile_build(name, steps, upload=None):
    """Asks for a build of `steps` (uploading `upload` for filesHash H first); its end."""
    status, made = api("POST", "/v3/templates", {"name": name})
    equal(f"{name}: the build is accepted", status, 202)
    tid, bid = made["templateID"], made["buildID"]
    if upload is not None:
        hash_, payload = upload
        _, link = api("GET", f"/templates/{tid}/files/{hash_}")
        req = urllib.request.Request(link["url"], data=payload, method="PUT")
        urllib.request.urlopen(req, timeout=30).close()
    status, _ = api("POST", f"/v2/templates/{tid}/builds/{bid}",
                    {"fromImage": "ubuntu:22.04", "steps": steps})
    equal(f"{name}: the build starts", status, 202)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        _, info = api("GET", f"/templates/{tid}/builds/{bid}/status")
        if info["status"] not in ("building", "waiting"):
            return info
        time.sleep(0.3)
    return info


def test_hostile_builds():
    # A tar whose entry climbs out of the build context.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"owned"
        entry = tarfile.TarInfo("../../../escaped-by-template.txt")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    hash_ = hashlib.sha256(buf.getvalue()).hexdigest()
    copy = [{"type": "COPY", "args": ["x", "/x", "", ""], "filesHash": hash_}]
    info = hostile_build(f"{NAME}-climb", copy, upload=(hash_, buf.getvalue()))
    equal("an upload that climbs out fails its build", info["status"], "error")
    reason = (info.get("reason") or {}).get("message", "")
    check("the reason names the refused entry", "escaped-by-template.txt" in reason, reason)
    # A step that would add a Dockerfile line of its own.
    sneaky = [{"type": "RUN", "args": ["true", "root\nRUN touch /pwned"]}]
    info = hostile_build(f"{NAME}-inject", sneaky)
    equal("a user name with a new line fails its build", info["status"], "error")
    reason = (info.get("reason") or {}).get("message", "")
    check("the reason names the step", "steps[0]" in reason, reason)
    status, _ = api("GET", "/templates/nope/files/..%2F..%2Fetc")
    check("a files hash that is a path is refused", status in (400, 404), status)
    status, _ = api("POST", "/v3/templates", {"name": "base"})
    equal("base cannot be built over", status, 400)


def test_unknown_template():
    e = raises("an unknown template is refused", SandboxException,
               lambda: Sandbox.create(f"never-built-{RUN}", timeout=60))
    check("the refusal says 404 not found", e is not None and "404" in str(e), e)


def main():
    setup_context()
    for fn in [
        test_exists,
        test_build_and_run,
        test_same_content_is_not_built_again,
        test_tags,
        test_from_template,
        test_failing_step,
        test_unknown_base_image,
        test_background_build_status,
        test_builds_at_once_are_bounded,
        test_upload_needs_its_signature,
        test_hostile_builds,
        test_unknown_template,
    ]:
        case(fn)
    print(f"{e2b_checks.PASSED} passed, {e2b_checks.FAILED} failed")
    return 1 if e2b_checks.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
