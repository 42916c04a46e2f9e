"""Soak test (not run in CI): many millions of steps with flat memory, fds and /dev/shm entries.

    .venv/bin/python benchmarks/soak.py --steps 10000000 --num-envs 64

Every ``--every`` env steps it samples the main process's and the workers' resident memory,
open file descriptors, shmvec's /dev/shm entries and the segments this process maps, and
prints one line; at the end it prints the first and last samples side by side and exits
non-zero if memory grew by more than ``--max-growth-mb`` or if the fd count, /dev/shm entries
or mapped segments changed. Episodes end all the time (CartPole), infos flow
(RecordEpisodeStatistics), and the env is rebuilt ``--rebuilds`` times so construction and
close are soaked too, with the cyclic garbage collector off (``--gc`` leaves it on): close()
must release everything itself.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import gymnasium as gym
import numpy as np

import shmvec


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def shm_entries() -> int:
    return sum(1 for name in os.listdir("/dev/shm") if name.startswith("shmvec_"))


def mapped_segments() -> int:
    """shmvec's segments this process maps (a closed env's must be unmapped)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/shmvec_" in line)


def sample(envs: shmvec.ShmVecEnv) -> dict:
    pids = envs.worker_pids
    return {
        "main_rss_mb": rss_mb(os.getpid()),
        "worker_rss_mb": sum(rss_mb(p) for p in pids),
        "main_fds": fd_count(os.getpid()),
        "shm_entries": shm_entries(),
        "mapped_segments": mapped_segments(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000_000, help="env steps in total")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--every", type=int, default=1_000_000, help="env steps between samples")
    parser.add_argument("--rebuilds", type=int, default=4, help="times the vector env is closed and rebuilt")
    parser.add_argument("--max-growth-mb", type=float, default=20.0)
    parser.add_argument("--gc", action="store_true", help="leave the cyclic garbage collector on")
    args = parser.parse_args()
    if not args.gc:
        # Off: close() must release every descriptor and mapping itself, with no cycle for the
        # collector to find (a cycle would show here as memory, descriptors or mappings growing).
        gc.disable()

    def build() -> shmvec.ShmVecEnv:
        envs = shmvec.make("CartPole-v1", num_envs=args.num_envs, num_workers=args.num_workers,
                           wrappers=[gym.wrappers.RecordEpisodeStatistics])
        envs.reset(seed=0)
        return envs

    n = args.num_envs
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n) for _ in range(64)]
    per_build = args.steps // (args.rebuilds + 1)
    envs = build()
    # Baseline after a warm-up, so that lazily allocated buffers do not count as growth.
    for i in range(2000):
        envs.step(actions[i % 64])
    first = sample(envs)
    samples = [first]
    done, next_sample, next_rebuild = 0, args.every, per_build
    t0 = time.perf_counter()
    episodes = 0
    while done < args.steps:
        _, _, term, trunc, infos = envs.step(actions[(done // n) % 64])
        episodes += int(np.count_nonzero(term | trunc))
        done += n
        if done >= next_rebuild:
            envs.close()
            envs = build()
            next_rebuild += per_build
        if done >= next_sample:
            s = sample(envs)
            samples.append(s)
            rate = done / (time.perf_counter() - t0)
            print(f"{done:>11,} steps  {rate:>9,.0f} steps/s  episodes {episodes:>9,}  " +
                  "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items()),
                  flush=True)
            next_sample += args.every
    last = sample(envs)
    envs.close()
    print(f"\nfirst: {first}\nlast:  {last}")
    grew = (last["main_rss_mb"] - first["main_rss_mb"]) + (last["worker_rss_mb"] - first["worker_rss_mb"])
    ok = (grew <= args.max_growth_mb and last["main_fds"] == first["main_fds"]
          and last["shm_entries"] == first["shm_entries"] and last["mapped_segments"] == first["mapped_segments"])
    print(f"memory growth {grew:+.1f} MB, fds {first['main_fds']} -> {last['main_fds']}, "
          f"/dev/shm entries {first['shm_entries']} -> {last['shm_entries']}, mapped segments "
          f"{first['mapped_segments']} -> {last['mapped_segments']}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
