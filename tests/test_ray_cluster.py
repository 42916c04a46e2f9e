"""RayVecEnv on a real two-node Ray cluster started with ``ray start``, as a user starts one.

Both nodes run on this machine (a head, then a second node joining its address, each with its
own raylet and CPUs), and the driver is a script of its own that joins them
(``tests/ray_cluster_driver.py``): actors are placed on both nodes, a rollout equals a local
one, and a node killed in the middle of a rollout ends it with an ActorDied that names the node.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from test_ray import gone

pytest.importorskip("ray", reason="the ray extra is part of dev: make test installs it")

HERE = os.path.dirname(os.path.abspath(__file__))
RAY = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
# Ray authenticates every node and driver of a cluster with one token: these share this one.
ENV = dict(
    os.environ,
    RAY_AUTH_MODE="token",
    RAY_AUTH_TOKEN=secrets.token_hex(16),
    PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*args: str) -> subprocess.Popen:
    """``ray start --block ...`` in a session of its own: killing the session kills the node."""
    return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _kill(node: subprocess.Popen) -> None:
    try:
        os.killpg(node.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    node.wait(timeout=30)


def _drive(address: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, os.path.join(HERE, "ray_cluster_driver.py"), address, *args], env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert found, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(found[-1][len("RESULT "):])


@pytest.fixture
def two_nodes():
    """A head node and a second node of 2 CPUs each; yields the address and the second node.

    The nodes keep their files in a temporary folder of their own: ``ray start --head`` records
    its address there, where a later ``ray.init()`` of another test (or of the user) would
    otherwise find a dead cluster's address and try to join it.
    """
    if RAY is None:
        pytest.skip("the ray command is not installed")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="shmvec-ray-", dir="/tmp")  # short: Ray's socket paths live in it
    head = _start("--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}")
    second = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the head's GCS must listen before a node can join it
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or head.poll() is not None:
                    raise RuntimeError("the Ray head node did not start") from None
                time.sleep(0.3)
        second = _start(f"--address=127.0.0.1:{port}", "--num-cpus=2", f"--temp-dir={temp}")
        yield f"127.0.0.1:{port}", second
    finally:
        for node in (second, head):
            if node is not None:
                _kill(node)
        shutil.rmtree(temp, ignore_errors=True)


def test_actors_on_both_nodes_equal_a_local_rollout(two_nodes):
    address, _ = two_nodes
    found = _drive(address, "equal")
    assert found == {"nodes": 2, "actor_nodes": 2}


def test_a_node_killed_mid_rollout_is_an_actor_died_naming_it(two_nodes):
    address, second = two_nodes
    found = _drive(address, "kill", str(second.pid))
    assert not found["hung"], "the rollout hung after the node died"
    assert len(found["victims"]) == 1 and found["error"] == "ActorDied", found
    assert found["actor_index"] == found["victims"][0] and found["node_matches"] and found["node_ip_named"]
    assert f"Ray actor {found['actor_index']}" in found["message"]
    assert found["closed"], "the vector env should be closed after an actor died"
    assert gone(found["survivor_pids"]), "the surviving actor outlived the vector env"
