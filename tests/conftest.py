import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import macos_profile  # noqa: E402,F401  (SHMVEC_TEST_PROFILE=macos: applied before shmvec loads)

from shmvec import joining  # noqa: E402

# A worker whose handshake never completes (a forked child that deadlocks under QEMU's user
# mode, say) ends in StepTimeout naming it and its phase before pytest's own 300 s timeout
# ends the test with only a stack: start-ups here take seconds, under emulation too.
joining.START_S = 240.0


def shm_entries() -> set[str]:
    # Only this process's segments: other test runs on the machine may hold theirs.
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(f"shmvec_{os.getpid()}_")}
    except FileNotFoundError:
        return set()


def children_alive() -> list:
    deadline = time.monotonic() + 5.0
    while True:
        alive = [p for p in mp.active_children() if p.name.startswith("shmvec-worker")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test must leave no shared-memory segment and no worker process behind."""
    before = shm_entries()
    yield
    import gc

    gc.collect()
    assert shm_entries() - before == set(), "a shared-memory segment outlived its vector env"
    assert children_alive() == [], "a worker process outlived its vector env"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for one test module. Actors import the test helpers by name, so the
    tests folder goes on their PYTHONPATH (they inherit the driver's environment)."""
    ray = pytest.importorskip("ray", reason="the ray extra is part of dev: make test installs it")
    here = os.path.dirname(__file__)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = here if not old else os.pathsep.join([here, old])
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture
def sigint_handled():
    """Python's own SIGINT handler for the test (a KeyboardInterrupt on Ctrl-C), put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
