"""Multi-agent stepping: MultiAgentVecEnv against SuperSuit and a plain loop, paired rounds.

    .venv/bin/python benchmarks/multiagent.py --copies 16 --rounds 5 --json results/multiagent.json

Engines (all on MPE's ``simple_spread_v3``, N=3 agents, ``max_cycles=25``, random actions):

- ``serial``: the copies stepped one after the other with PettingZoo's parallel API (reset
  when a copy's agents are all done): what a hand-written loop does.
- ``supersuit-serial``: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), copies,
  num_cpus=0, base_class="gymnasium")``.
- ``supersuit-mp``: the same with ``num_cpus`` = usable cores (its multiprocessing backend).
- ``shmvec``: ``MultiAgentVecEnv`` with its defaults (every copy in a worker).
- ``ceiling``: the split-serial ceiling: the copies split over as many processes as usable
  cores, each stepping its share with the plain loop for the window, with no synchronisation at
  all. No engine that steps every copy in lockstep can beat it.

Each round times every engine for ``--seconds`` in turn (order rotated); the figure is agent
steps per second, and the report gives the median over rounds of each engine's ratio to
``serial`` and to ``supersuit-mp``, measured in the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from shmvec.checks import usable_cores

AGENTS = 3


def make_env() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=AGENTS, max_cycles=25)


class Serial:
    def __init__(self, copies: int) -> None:
        self.envs = [make_env() for _ in range(copies)]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)
        self.rows = copies * AGENTS

    def step(self, actions: np.ndarray) -> None:
        for i, env in enumerate(self.envs):
            if not env.agents:
                env.reset()
                continue
            env.step({a: actions[i * AGENTS + j] for j, a in enumerate(env.possible_agents)})

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VectorRows:
    """Any Gymnasium-style vector env with a row per agent."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.env.reset(seed=0)
        self.rows = env.num_envs

    def step(self, actions: np.ndarray) -> None:
        self.env.step(actions)

    def close(self) -> None:
        self.env.close()


class Ceiling:
    """The copies split over the usable cores, each share stepped serially in its own process."""

    def __init__(self, copies: int) -> None:
        from shmvec.blocks import split

        self.shares = [len(b) for b in split(copies, min(usable_cores(), copies))]
        self.rows = copies * AGENTS

    def rate(self, actions: list[np.ndarray], seconds: float) -> float:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        start, results = ctx.Barrier(len(self.shares) + 1), ctx.Queue()
        procs = [ctx.Process(target=_share, args=(n, actions, seconds, start, results)) for n in self.shares]
        for p in procs:
            p.start()
        start.wait()
        agent_steps = sum(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join()
        return agent_steps / seconds

    def close(self) -> None:
        pass


def _share(copies: int, actions: list[np.ndarray], seconds: float, start: Any, results: Any) -> None:
    stepper = Serial(copies)
    for a in actions[:20]:
        stepper.step(a)
    start.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        stepper.step(actions[steps % len(actions)])
        steps += 1
    results.put(steps * stepper.rows)
    stepper.close()


def build(engine: str, copies: int) -> Any:
    if engine == "ceiling":
        return Ceiling(copies)
    if engine == "serial":
        return Serial(copies)
    if engine.startswith("supersuit"):
        import supersuit as ss

        cpus = 0 if engine == "supersuit-serial" else usable_cores()
        venv = ss.concat_vec_envs_v1(
            ss.pettingzoo_env_to_vec_env_v1(make_env()), copies, num_cpus=cpus, base_class="gymnasium"
        )
        return VectorRows(venv)
    if engine == "shmvec":
        from shmvec.pettingzoo import MultiAgentVecEnv

        return VectorRows(MultiAgentVecEnv([make_env] * copies))
    raise ValueError(engine)


def rate(stepper: Any, actions: list[np.ndarray], seconds: float) -> float:
    """Agent steps per second over ``seconds`` (after a short warm-up)."""
    if isinstance(stepper, Ceiling):
        return stepper.rate(actions, seconds)
    for a in actions[:20]:
        stepper.step(a)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        stepper.step(actions[steps % len(actions)])
        steps += 1
    return steps * stepper.rows / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--engines", default="serial,supersuit-serial,supersuit-mp,shmvec,ceiling")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 5, size=args.copies * AGENTS) for _ in range(64)]
    steppers = {e: build(e, args.copies) for e in engines}
    rounds: list[dict[str, float]] = []
    try:
        for r in range(args.rounds):
            order = engines[r % len(engines) :] + engines[: r % len(engines)]
            rounds.append({e: rate(steppers[e], actions, args.seconds) for e in order})
    finally:
        for s in steppers.values():
            s.close()
    report: dict[str, Any] = {"copies": args.copies, "agents": AGENTS, "rounds": rounds, "median": {}, "ratios": {}}
    for e in engines:
        report["median"][e] = statistics.median(r[e] for r in rounds)
        for peer in ("serial", "supersuit-mp", "ceiling"):
            if peer in engines and e != peer:
                report["ratios"][f"{e} / {peer}"] = statistics.median(r[e] / r[peer] for r in rounds)
    print(f"simple_spread_v3, {args.copies} copies x {AGENTS} agents, {args.rounds} paired rounds of {args.seconds} s")
    for e in engines:
        print(f"  {e:18s} {report['median'][e]:>10,.0f} agent steps/s (median)")
    for name, value in report["ratios"].items():
        print(f"  {name:30s} {value:.2f}x (median of same-round ratios)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
