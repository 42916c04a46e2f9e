"""A driver script for tests/test_ray_cluster.py: joins a running Ray cluster, as a user's script
does, runs one scenario and prints its findings as one JSON line.

    python ray_cluster_driver.py ADDRESS equal         # actors on both nodes, rollouts vs local
    python ray_cluster_driver.py ADDRESS kill PID      # kill the node started by `ray start` PID mid-rollout

A script of its own because Ray reads its authentication settings when it is imported: the
test process imported Ray for other tests already.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import ray
from test_ray import same_batch
from test_rollout import cartpole, cartpole_policy

import shmvec
from shmvec.ray import RayVecEnv


def slow_policy(obs):
    """A rollout long enough to be cut: at least 5 ms per step."""
    time.sleep(0.005)
    return cartpole_policy(obs)


def equal() -> dict:
    nodes = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    local = shmvec.ShmVecEnv([cartpole] * 8, num_workers=2)
    remote = RayVecEnv([cartpole] * 8, num_actors=2, num_workers_per_actor=2)  # 2 CPUs each: one per node
    try:
        local.reset(seed=4)
        remote.reset(seed=4)
        for T in (40, 40):
            same_batch(local.rollout(cartpole_policy, T), remote.rollout(cartpole_policy, T))
        np.testing.assert_array_equal(local.episode_returns, remote.episode_returns)
        return {"nodes": len(nodes), "actor_nodes": len({info["node_id"] for info in remote._info} & nodes)}
    finally:
        local.close()
        remote.close()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc: the node's raylet, its workers, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill(pid: int) -> dict:
    envs = RayVecEnv([cartpole] * 8, num_actors=2, num_workers_per_actor=2)
    here = ray.get_runtime_context().get_node_id()
    victims = [k for k, info in enumerate(envs._info) if info["node_id"] != here]
    envs.reset(seed=0)
    caught: list[BaseException] = []

    def rollout():
        try:
            envs.rollout(slow_policy, 400)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=rollout)
    thread.start()
    time.sleep(1.0)  # the actors are inside their rollout
    for p in descendants(pid):  # the node goes down at once, as a machine that loses power
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    thread.join(timeout=120)
    err = caught[0] if caught else None
    try:
        envs.reset()
        closed = False
    except shmvec.ClosedError:
        closed = True
    return {
        "hung": thread.is_alive(),
        "victims": victims,
        "error": type(err).__name__ if err is not None else None,
        "message": str(err),
        "actor_index": getattr(err, "actor_index", None),
        "node_matches": getattr(err, "node_id", None) == envs._info[victims[0]]["node_id"] if victims else False,
        "node_ip_named": getattr(err, "node_ip", "?") in str(err),
        "closed": closed,
        "survivor_pids": [info["pid"] for k, info in enumerate(envs._info) if k not in victims],
    }


if __name__ == "__main__":
    address, scenario, *rest = sys.argv[1:]
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    deadline = time.monotonic() + 90
    while len([n for n in ray.nodes() if n.get("Alive")]) < 2:  # the second node may still be joining
        if time.monotonic() > deadline:
            sys.exit("the second Ray node did not join within 90 s")
        time.sleep(0.3)
    result = equal() if scenario == "equal" else kill(int(rest[0]))
    print("RESULT " + json.dumps(result), flush=True)
