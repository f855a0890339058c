"""What every conformance check uses: the tally of passed and failed checks, and the
helpers that add to it."""

import sys
import time
import traceback
import uuid

PASSED = 0
FAILED = 0
# Marks what this run makes, for metadata queries that must not see another run's sandboxes.
RUN = uuid.uuid4().hex[:8]


def check(name, cond, detail=""):
    """Record one assertion."""
    global PASSED, FAILED
    if cond:
        PASSED += 1
        print(f"PASS {name}")
    else:
        FAILED += 1
        print(f"FAIL {name}: {detail}")
    sys.stdout.flush()


def equal(name, got, want):
    check(name, got == want, f"got {got!r}, want {want!r}")


def walk_pages(paginator, most=10):
    """The sizes of a list's pages and the ids on them, at most `most` pages past the first."""
    pages, seen = [], []
    while paginator.has_next:
        items = paginator.next_items()
        pages.append(len(items))
        seen.extend(i.sandbox_id for i in items)
        if len(pages) > most:
            break
    return pages, seen


def raises(name, exc_type, fn):
    """Check that fn() raises exc_type; return the exception (or None)."""
    try:
        fn()
    except exc_type as e:  # noqa: PERF203 - one call
        check(name, True)
        return e
    except Exception as e:  # pragma: no cover - reported as a failure
        check(name, False, f"raised {type(e).__name__}: {e}")
        return None
    check(name, False, f"did not raise {exc_type.__name__}")
    return None


def case(fn):
    """Run one group of checks; an unexpected exception fails the group, not the run."""
    try:
        fn()
    except Exception as e:
        check(f"{fn.__name__} (completes)", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()


def wait_until(cond, within=15.0):
    """Poll cond() until it holds or `within` seconds pass; whether it held."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()
