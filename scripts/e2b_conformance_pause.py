"""Conformance checks of pausing and resuming: by hand, at a timeout, and by traffic."""

from e2b import FileNotFoundException, Sandbox, SandboxQuery

from e2b_checks import RUN, check, equal, raises, wait_until, walk_pages

# What tells a memory resume (the same boot) from a reboot, as the SDK's own tests read it.
BOOT_ID = "/proc/sys/kernel/random/boot_id"


# A background counter: the next number in /home/user/count every 50 ms.
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /home/user/count; sleep 0.05; done"


def counted(sbx):
    try:
        text = sbx.files.read("/home/user/count").strip()
    except FileNotFoundException:
        return 0
    return int(text) if text.isdigit() else 0


def state_of(sbx_id):
    return str(Sandbox.get_info(sbx_id).state.value)


def test_pause_memory():
    from e2b import SandboxState

    meta = {"suite": "conformance-pause", "run": RUN}
    sbx = Sandbox.create(timeout=120, metadata=meta)
    h = sbx.commands.run(COUNTER, background=True, timeout=0)
    sbx.files.write("/home/user/kept.txt", "kept")
    boot = sbx.files.read(BOOT_ID)
    equal("commands read the boot id files read", sbx.commands.run(f"cat {BOOT_ID}").stdout, boot)
    check("the boot id is the sandbox's, not the host's", boot != open(BOOT_ID).read(), boot)
    check("memory pause: the counter runs", wait_until(lambda: counted(sbx) > 2))
    equal("pause", sbx.pause(), True)
    equal("pause of a paused sandbox returns False", sbx.pause(), False)
    equal("is_running while paused", sbx.is_running(), False)
    equal("get_info state while paused", state_of(sbx.sandbox_id), "paused")
    listed = Sandbox.list(query=SandboxQuery(metadata=meta, state=[SandboxState.PAUSED]))
    ids = [i.sandbox_id for i in listed.next_items()]
    equal("a paused sandbox lists as paused", ids, [sbx.sandbox_id])
    resumed = Sandbox.connect(sbx.sandbox_id)
    equal("connect resumes", resumed.is_running(), True)
    equal("get_info state after the resume", state_of(sbx.sandbox_id), "running")
    before = counted(resumed)
    check(
        "the background process goes on after a memory pause",
        wait_until(lambda: counted(resumed) > before + 2),
    )
    check(
        "the background process is listed after a memory pause",
        any(p.pid == h.pid for p in resumed.commands.list()),
    )
    equal("a file survives a memory pause", resumed.files.read("/home/user/kept.txt"), "kept")
    equal("a memory resume keeps the boot id", resumed.files.read(BOOT_ID), boot)
    resumed.kill()


def test_pause_filesystem():
    sbx = Sandbox.create(timeout=120)
    h = sbx.commands.run("sleep 1000", background=True, timeout=0)
    sbx.files.write("/home/user/kept.txt", "kept")
    boot = sbx.files.read(BOOT_ID)
    equal("filesystem pause", sbx.pause(mode="filesystem"), True)
    equal("get_info state after a filesystem pause", state_of(sbx.sandbox_id), "paused")
    rebooted = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
    equal("a file survives a filesystem pause", rebooted.files.read("/home/user/kept.txt"), "kept")
    check(
        "a process does not survive a filesystem pause",
        all(p.pid != h.pid for p in rebooted.commands.list()),
    )
    equal("a rebooted sandbox runs commands", rebooted.commands.run("echo up").stdout, "up\n")
    rebooted_boot = rebooted.files.read(BOOT_ID)
    check("a reboot gives a new boot id", rebooted_boot not in ("", boot), (boot, rebooted_boot))
    equal("commands read the new boot id", rebooted.commands.run(f"cat {BOOT_ID}").stdout, rebooted_boot)
    rebooted.kill()


def test_auto_pause_on_timeout():
    from e2b import SandboxState

    # keep_memory unset (None) is a memory pause.
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": {"action": "pause", "keep_memory": None}})
    boot = sbx.files.read(BOOT_ID)
    lifecycle = sbx.get_info().lifecycle
    equal("lifecycle on_timeout", lifecycle["on_timeout"], "pause")
    equal("lifecycle auto_resume", lifecycle["auto_resume"], False)
    check("paused at its timeout", wait_until(lambda: state_of(sbx.sandbox_id) == "paused"))
    listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
    check("an auto-paused sandbox lists as paused", sbx.sandbox_id in [i.sandbox_id for i in listed])
    equal("no envd while auto-paused", sbx.is_running(), False)
    again = Sandbox.connect(sbx.sandbox_id, timeout=60)
    equal("connect resumes an auto-paused sandbox", again.commands.run("echo back").stdout, "back\n")
    equal("an auto-pause keeps the memory by default", again.files.read(BOOT_ID), boot)
    again.kill()


def test_auto_pause_filesystem_only():
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}})
    sbx.files.write("/home/user/marker.txt", "fs-only")
    boot = sbx.files.read(BOOT_ID)
    check("paused filesystem-only at its timeout", wait_until(lambda: state_of(sbx.sandbox_id) == "paused"))
    again = sbx.connect()
    equal("a filesystem-only auto-pause keeps the files", again.files.read("/home/user/marker.txt"), "fs-only")
    check("connect reboots it", again.files.read(BOOT_ID) not in ("", boot), boot)
    again.kill()


def test_auto_resume():
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    equal("lifecycle auto_resume", sbx.get_info().lifecycle["auto_resume"], True)
    check("auto-resume sandbox paused at its timeout", wait_until(lambda: state_of(sbx.sandbox_id) == "paused"))
    equal("an envd call wakes an auto-resume sandbox", sbx.commands.run("echo awake").stdout, "awake\n")
    equal("state after the wake", state_of(sbx.sandbox_id), "running")
    sbx.kill()


def test_list_by_state_with_pages():
    from e2b import SandboxState

    meta = {"suite": "conformance-pause-list", "run": RUN}
    made = [Sandbox.create(metadata=meta, timeout=120) for _ in range(3)]
    for s in made[1:]:
        s.pause()
    paginator = Sandbox.list(query=SandboxQuery(metadata=meta, state=[SandboxState.PAUSED]), limit=1)
    pages, seen = walk_pages(paginator)
    equal("paused list pages of 1 over 2", pages, [1, 1])
    equal("paused list finds the paused ones", sorted(seen), sorted(s.sandbox_id for s in made[1:]))
    running = Sandbox.list(query=SandboxQuery(metadata=meta, state=[SandboxState.RUNNING])).next_items()
    equal("running list finds the running one", [i.sandbox_id for i in running], [made[0].sandbox_id])
    both = Sandbox.list(query=SandboxQuery(metadata=meta)).next_items()
    equal(
        "default list has both states",
        sorted(str(i.state.value) for i in both),
        ["paused", "paused", "running"],
    )
    for s in made:
        s.kill()


def test_kill_paused():
    from e2b import SandboxNotFoundException

    sbx = Sandbox.create(timeout=120)
    equal("pause before kill", sbx.pause(), True)
    equal("kill of a paused sandbox", Sandbox.kill(sbx.sandbox_id), True)
    equal("kill of a killed paused sandbox", Sandbox.kill(sbx.sandbox_id), False)
    raises(
        "connect to a killed paused sandbox",
        SandboxNotFoundException,
        lambda: Sandbox.connect(sbx.sandbox_id),
    )
