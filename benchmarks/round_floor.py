"""A synchronous ``step`` against the machine's floor: the wall time of a ``step`` of 16 do-nothing
envs on 2 workers at shmvec's defaults, and a bare shared-memory round trip to one spinning
process (``test_bench_sync``'s "spin on a shared int64 word"), measured alternately in the same
run, with their ratio per repeat.

    .venv/bin/python benchmarks/round_floor.py --json benchmarks/results-2core/round_floor.json --write-docs

(``make bench-round-floor``.) The round trip is what no vector env can beat: one word written,
one word seen changed by a process spinning on its own core, and back. A ``step`` adds the
caller's work (the actions checked and written, the round posted and waited for, the results
copied out) and the workers' (each steps 8 envs that do nothing). The partner of the round trip
runs only while its own timing does, so that it takes no core from the workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (test_bench_sync beside it)

from test_bench_sync import _spin_word  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs/benchmarks.md"
MARKERS = ("<!-- round-floor:begin -->\n", "\n<!-- round-floor:end -->")
NUM_ENVS, NUM_WORKERS = 16, 2


def per_call_us(fn, calls: int) -> float:
    """Microseconds per call of ``fn``: the median of 10 groups of ``calls // 10``."""
    group = max(1, calls // 10)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(group):
            fn()
        times.append((time.perf_counter() - t0) / group)
    return statistics.median(times) * 1e6


def round_trip_us(calls: int) -> float:
    """A bare round trip to a freshly forked spinning partner, closed after."""
    pair = _spin_word()
    try:
        for _ in range(1000):  # the partner is up and spinning before timing starts
            pair.ping()
        return per_call_us(pair.ping, calls)
    finally:
        pair.close()


def measure(repeats: int, calls: int) -> dict:
    import shmvec
    from shmvec.envs import SyntheticEnv

    def fn():
        return SyntheticEnv(obs_shape=(8,), obs_dtype="float32", step_us=0.0, reset_us=0.0)

    envs = shmvec.ShmVecEnv([fn] * NUM_ENVS, num_workers=NUM_WORKERS)
    try:
        actions = np.zeros(NUM_ENVS, np.int64)
        envs.reset(seed=0)

        def step() -> None:
            envs.step(actions)

        for _ in range(1000):
            step()
        rows = []
        for _ in range(repeats):
            floor = round_trip_us(calls)
            step_us = per_call_us(step, calls)
            rows.append({"round_trip_us": floor, "step_us": step_us, "ratio": step_us / floor})
    finally:
        envs.close()
    return {
        "num_envs": NUM_ENVS,
        "num_workers": NUM_WORKERS,
        "calls": calls,
        "repeats": rows,
        "median_round_trip_us": statistics.median(r["round_trip_us"] for r in rows),
        "median_step_us": statistics.median(r["step_us"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
    }


def format_table(result: dict) -> str:
    """The Markdown table docs/benchmarks.md quotes from a result (``--json``'s)."""
    lines = [
        "| | bare round trip | `step`, 16 envs, 2 workers | step / round trip |",
        "|---|---:|---:|---:|",
    ]
    for k, r in enumerate(result["repeats"], 1):
        lines.append(f"| repeat {k} | {r['round_trip_us']:.1f} us | {r['step_us']:.1f} us | {r['ratio']:.1f}x |")
    lines.append(
        f"| **median** | {result['median_round_trip_us']:.1f} us | {result['median_step_us']:.1f} us "
        f"| **{result['median_ratio']:.1f}x** |"
    )
    return "\n".join(lines)


def write_docs(result: dict) -> None:
    text = DOCS.read_text()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    DOCS.write_text(text[:start] + format_table(result) + text[end:])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000, help="timed calls of each per repeat")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    result = measure(args.repeats, args.calls)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.write_docs:
        write_docs(result)
    return result


if __name__ == "__main__":
    main()
