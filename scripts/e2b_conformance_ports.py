"""Conformance checks of a sandbox's own ports (`get_host`), as E2B's edge proxy serves
them: a server in the sandbox reached from the host, a port nobody listens on, a traffic
access token, and a paused sandbox woken by an HTTP request.

The emulator serves every sandbox host on its one address: a plain request goes to
E2B_SANDBOX_URL with the SDK's `get_host(port)` as its Host, as a DNS record would send it
to E2B's proxy, and `https://<get_host(port)>` is reached as the SDK's own tests reach it,
with the emulator as HTTPS_PROXY and its certificate's authority as SSL_CERT_FILE (set by
conformance.sh)."""

import os
import socket

import httpx
from e2b import Sandbox

from e2b_checks import check, equal, wait_until

URL = os.environ["E2B_SANDBOX_URL"]


def free_port():
    """A port nothing on this machine listens on now (the emulator's sandboxes share its
    network unless they are denied the internet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(sbx, port, headers=None):
    return httpx.get(f"{URL}/", headers={"Host": sbx.get_host(port), **(headers or {})}, timeout=15)


def serve(sbx, port):
    """Starts python's http.server on `port` in the sandbox, serving a marker file."""
    sbx.files.write("/home/user/www/marker.txt", "served from the sandbox\n")
    cmd = sbx.commands.run(f"cd /home/user/www && python3 -m http.server {port}", background=True)
    check(f"a server on {port} in the sandbox starts", wait_until(lambda: get(sbx, port).status_code == 200))
    return cmd


def test_ping_server():
    sbx = Sandbox.create(timeout=120)
    port = free_port()
    closed = get(sbx, port)
    equal("a port nobody listens on", closed.status_code, 502)
    equal("its message", closed.json().get("message"), "The sandbox is running but port is not open")
    serve(sbx, port)
    res = httpx.get(f"{URL}/marker.txt", headers={"Host": sbx.get_host(port)}, timeout=15)
    equal("a server in the sandbox answers through get_host", res.status_code, 200)
    equal("with the sandbox's file", res.text, "served from the sandbox\n")
    routed = httpx.get(
        f"{URL}/marker.txt",
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)},
        timeout=15,
    )
    equal("the routing headers reach it too", routed.text, "served from the sandbox\n")
    with socket.socket() as host_server:
        host_server.bind(("127.0.0.1", 0))
        host_server.listen()
        host_port = host_server.getsockname()[1]
        equal("a port the host listens on is not the sandbox's", get(sbx, host_port).status_code, 502)
    other = Sandbox.create(timeout=120)
    equal("another sandbox's host does not reach it", get(other, port).status_code, 502)
    other.kill()
    sbx.kill()
    equal("a killed sandbox's port", get(sbx, port).json().get("message"), "The sandbox was not found")


def test_ports_without_internet():
    if os.geteuid() != 0:
        check("a port of a sandbox without internet (needs root: skipped)", True)
        return
    sbx = Sandbox.create(timeout=120, allow_internet_access=False)
    port = free_port()
    serve(sbx, port)
    equal("a server of a sandbox without internet answers", get(sbx, port).status_code, 200)
    sbx.kill()


def test_traffic_access_token():
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    check("a private sandbox has a traffic access token", sbx.traffic_access_token is not None)
    port = free_port()
    sbx.commands.run(f"cd /home/user && python3 -m http.server {port}", background=True)
    token = {"e2b-traffic-access-token": sbx.traffic_access_token}
    check("its server starts", wait_until(lambda: get(sbx, port, token).status_code == 200, within=15))
    equal("without the token", get(sbx, port).status_code, 403)
    equal("with a wrong token", get(sbx, port, {"e2b-traffic-access-token": "x"}).status_code, 403)
    public = Sandbox.create(timeout=120)
    equal("a public sandbox has none", public.traffic_access_token, None)
    public.kill()
    sbx.kill()


def test_https():
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    port = free_port()
    token = {"e2b-traffic-access-token": sbx.traffic_access_token}
    sbx.files.write("/home/user/www/marker.txt", "served from the sandbox\n")
    sbx.commands.run(f"cd /home/user/www && python3 -m http.server {port}", background=True)
    url = f"https://{sbx.get_host(port)}"
    check("https: the server starts", wait_until(lambda: get(sbx, port, token).status_code == 200))
    with httpx.Client(timeout=15) as client:
        res = client.get(f"{url}/marker.txt", headers=token)
        equal("https://<get_host(port)> reaches the sandbox's server", res.text, "served from the sandbox\n")
        again = client.get(f"{url}/marker.txt", headers=token)
        equal("a second request on the client", again.status_code, 200)
        equal("https without the token", client.get(url).status_code, 403)
    closed = httpx.get(f"https://{sbx.get_host(free_port())}", headers=token, timeout=15)
    equal("https to a port nobody listens on", closed.status_code, 502)
    sbx.kill()


def test_auto_resume_on_http_request():
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    port = free_port()
    serve(sbx, port)
    paused = wait_until(lambda: str(Sandbox.get_info(sbx.sandbox_id).state.value) == "paused")
    check("paused at its timeout", paused)
    # As the SDK's own test asks it.
    res = httpx.get(f"https://{sbx.get_host(port)}", timeout=15.0)
    equal("an HTTPS request wakes it and is answered", res.status_code, 200)
    equal("running after the request", str(sbx.get_info().state.value), "running")
    sbx.kill()


def test_paused_without_auto_resume():
    sbx = Sandbox.create(timeout=120)
    port = free_port()
    serve(sbx, port)
    sbx.pause()
    res = get(sbx, port)
    equal("a paused sandbox's port", res.status_code, 502)
    equal("is not woken", str(Sandbox.get_info(sbx.sandbox_id).state.value), "paused")
    Sandbox.kill(sbx.sandbox_id)


TESTS = [
    test_ping_server,
    test_ports_without_internet,
    test_traffic_access_token,
    test_https,
    test_auto_resume_on_http_request,
    test_paused_without_auto_resume,
]
