"""Per-step latency of ``ShmVecEnv`` against Gymnasium's ``SyncVectorEnv`` on CartPole at small N.

At small N a vector step is all overhead (CartPole's own step is ~5 us), so this is where a
multi-process engine pays for its synchronisation; the throughput sweep (``make bench``) shows
the other end. Each benchmark times one ``step`` with pre-generated random actions.

Run: ``make bench-micro`` or ``pytest benchmarks/test_bench_step.py --benchmark-only``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import shmvec

# 2,000 steps per benchmark, timed in groups of 10: short, and bounded on a busy machine.
ROUNDS, ITERATIONS = 200, 10
SIZES = [1, 4, 16]


def _make(engine: str, num_envs: int) -> gym.vector.VectorEnv:
    if engine == "shmvec":
        return shmvec.make("CartPole-v1", num_envs=num_envs, num_workers=min(2, num_envs))
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)


@pytest.fixture(params=[(engine, n) for n in SIZES for engine in ("shmvec", "SyncVectorEnv")],
                ids=lambda p: f"{p[0]}-N{p[1]}")
def stepping(request) -> Iterator[tuple[Any, list[np.ndarray]]]:
    engine, n = request.param
    envs = _make(engine, n)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    actions = [envs.action_space.sample() for _ in range(64)]
    yield envs, actions
    envs.close()


@pytest.mark.benchmark(group="CartPole step latency")
def test_step_latency(benchmark, stepping):
    envs, actions = stepping
    counter = iter(range(10**9))

    def step() -> None:
        envs.step(actions[next(counter) % len(actions)])

    benchmark.pedantic(step, rounds=ROUNDS, iterations=ITERATIONS, warmup_rounds=10)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_step"] = round(stats.stats.median * 1e6, 2)
