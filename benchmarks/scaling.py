"""How shmvec scales with cores: the same cells at 1, 2, 4, ... workers, each paired with the serial loop.

    make bench-scaling                   # every power of two up to the usable cores (and that count)
    .venv/bin/python benchmarks/scaling.py --workers 1,2,4,8,16 --json results/scaling.json

At each worker count ``w`` it runs the ``make bench`` cells of CartPole-v1 and the heavy-tail
env at a fixed ``--num-envs`` (256 by default, so only the number of processes changes) for the
serial loop, split serial (the machine's ceiling at ``w`` processes), shmvec, shmvec with every
block in a worker, and async collection (``batch_size`` = one worker's block). All five are
measured round-robin (``shmvec.bench.measure.measure_group``), so each ratio is the median of
per-round ratios. The table gives, per ``w``: shmvec and split serial over the serial loop, and
async over sync step with the same workers, for each env.

Meant for a machine with more cores than this project's 2-core VM (a lent machine): about
40 s per worker count with the default timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from shmvec.bench.machine import usable_cores
from shmvec.bench.measure import Timing
from shmvec.bench.sweep import SweepConfig, SweepResult, run_sweep

WORKLOADS = ["cartpole", "heavy-tail"]
ENGINES = ["serial", "split-serial", "shmvec", "shmvec-procs", "shmvec-async"]
# (column title, workload, engine, peer)
COLUMNS = [
    ("CartPole shmvec x serial", "cartpole", "shmvec", "serial"),
    ("CartPole ceiling (split serial) x serial", "cartpole", "split-serial", "serial"),
    ("CartPole async / sync", "cartpole", "shmvec-async", "shmvec-procs"),
    ("heavy-tail shmvec x serial", "heavy-tail", "shmvec", "serial"),
    ("heavy-tail ceiling x serial", "heavy-tail", "split-serial", "serial"),
    ("heavy-tail async / sync", "heavy-tail", "shmvec-async", "shmvec-procs"),
]


def default_workers(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    out, w = [], 1
    while w < cores:
        out.append(w)
        w *= 2
    return out + [cores]


def table(sweeps: dict[int, SweepResult], num_envs: int) -> str:
    """One row per worker count: the paired ratios of :data:`COLUMNS` and the probe's capacity."""
    header = ["workers", "probe x1 process", *[c[0] for c in COLUMNS]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for w, sweep in sweeps.items():
        samples = sweep.machine.get("parallel_scaling", {}).get("samples") or []
        probe = f"{statistics.median(samples):.2f}x" if samples else "-"
        cells = []
        for _, workload, engine, peer in COLUMNS:
            ratio = sweep.ratio(workload, num_envs, engine, peer)
            if engine == "shmvec-async" and w == 1:
                cells.append("-")  # one block: every batch is all envs, nothing to overlap
            elif ratio is None:
                r = sweep.get(workload, num_envs, engine)
                cells.append("-" if r is None or r.ok else r.status)
            else:
                cells.append(f"{ratio:.2f}x")
        lines.append("| " + " | ".join([str(w), probe, *cells]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[int, SweepResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default=None, help="worker counts, e.g. 1,2,4,8 (default: powers of two "
                        "up to the usable cores)")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=1.0, help="one measurement window")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (windows per engine)")
    parser.add_argument("--json", default=None, help="also write every sweep's results to this file")
    args = parser.parse_args(argv)

    cores = usable_cores()
    workers = default_workers(cores) if args.workers is None else [int(x) for x in args.workers.split(",")]
    if any(w < 1 or args.num_envs % w for w in workers):
        parser.error(f"each worker count must be positive and divide --num-envs={args.num_envs}: {workers}")
    if max(workers) > cores:
        print(f"note: {max(workers)} workers on {cores} usable cores: the larger counts are oversubscribed",
              file=sys.stderr)
    timing = Timing(seconds=args.seconds, repeats=args.repeats, warmup=0.2)
    sweeps: dict[int, SweepResult] = {}
    for w in workers:
        print(f"{w} worker(s): {len(WORKLOADS)} workloads x {len(ENGINES)} engines at {args.num_envs} envs",
              file=sys.stderr)
        config = SweepConfig(workloads=WORKLOADS, engines=ENGINES, num_envs=[args.num_envs], timing=timing,
                             num_workers=w, max_procs=max(workers))
        sweeps[w] = run_sweep(config, progress=False)
    print(f"# shmvec scaling: {args.num_envs} envs, {cores} usable cores\n")
    print(table(sweeps, args.num_envs))
    failed = [f"{w} workers: {r.workload} {r.engine}: {r.reason}" for w, s in sweeps.items()
              for r in s.results if r.status == "failed"]
    for line in failed:
        print(f"- failed: {line}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({str(w): s.to_dict() for w, s in sweeps.items()}, indent=1))
    return sweeps


if __name__ == "__main__":
    main()
