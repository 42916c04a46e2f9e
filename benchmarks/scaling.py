"""How shmvec scales with cores: the same cells at 1, 2, 4, ... workers, each paired with the serial loop.

    make bench-scaling                   # CartPole, Pong, Ant at 16, 64, 256 envs; powers of two up to the cores
    .venv/bin/python benchmarks/scaling.py --workers 1,2,4,8,16 --json results/scaling.json
    .venv/bin/python benchmarks/scaling.py --workloads atari-pong,mujoco-ant --num-envs 32 \
        --engines split-serial,shmvec,shmvec-main,gym-async-shm --workers 1,4,16 --max-procs 40

At each worker count ``w`` it runs the ``make bench`` cells of the workloads (default CartPole-v1
and the heavy-tail env) at each of the fixed ``--num-envs`` (256 by default, so only the number
of processes changes; the real envs too run at the sizes given) for the serial loop and the engines (default: split serial, the machine's
ceiling at ``w`` processes; shmvec with its defaults, every env in a worker; shmvec with a
block in the calling process; async collection with ``batch_size`` = one worker's block, where
``w`` divides the sizes, as it needs equal blocks). Engines of at most ``w`` processes are measured
round-robin (``shmvec.bench.measure.measure_group``), so their ratios are medians of per-round
ratios; one-process-per-env peers (gym Async) run alone. The table gives, per ``w``, each
engine over the serial loop, and async over sync ``step`` with the same workers.

Meant for a machine with more cores than this project's 2-core VM (a lent machine): about
40 s per worker count with the default timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from shmvec.bench.measure import Timing
from shmvec.bench.output import write_study
from shmvec.bench.sweep import SweepConfig, SweepResult, run_sweep
from shmvec.checks import usable_cores

WORKLOADS = ["cartpole", "heavy-tail"]
ENGINES = ["serial", "split-serial", "shmvec", "shmvec-main", "shmvec-async"]
LABELS = {"split-serial": "ceiling (split serial)", "shmvec": "shmvec", "shmvec-main": "shmvec block in main",
          "shmvec-async": "async", "gym-async-shm": "gym Async(shm)", "envpool": "EnvPool"}


def columns(workloads: list[str], engines: list[str]) -> list[tuple[str, str, str, str]]:
    """``(title, workload, engine, peer)``: every engine over the serial loop, and async over
    sync ``step`` with the same workers (both with every env in a worker)."""
    out = []
    for w in workloads:
        for e in engines:
            if e == "serial":
                continue
            if e == "shmvec-async" and "shmvec" in engines:
                out.append((f"{w} async / sync", w, e, "shmvec"))
            else:
                out.append((f"{w} {LABELS.get(e, e)} x serial", w, e, "serial"))
    return out


def default_workers(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    out, w = [], 1
    while w < cores:
        out.append(w)
        w *= 2
    return out + [cores]


def table(sweeps: dict[int, SweepResult], num_envs: int, cols: list[tuple[str, str, str, str]]) -> str:
    """One row per worker count: the paired ratios of ``cols`` and the probe's capacity."""
    header = ["workers", "probe x1 process", *[c[0] for c in cols]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for w, sweep in sweeps.items():
        samples = sweep.machine.get("parallel_scaling", {}).get("samples") or []
        probe = f"{statistics.median(samples):.2f}x" if samples else "-"
        cells = []
        for _, workload, engine, peer in cols:
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
    parser.add_argument("--num-envs", default="256", help="sizes, e.g. 16,64,256 (every workload at each)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="e.g. cartpole,atari-pong,mujoco-ant")
    parser.add_argument("--engines", default=",".join(ENGINES), help="the serial loop is always added")
    parser.add_argument("--max-procs", type=int, default=None, help="skip engines that would start more "
                        "processes (default: the largest worker count)")
    parser.add_argument("--seconds", type=float, default=1.0, help="one measurement window")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (windows per engine)")
    parser.add_argument("--json", default=None, help="also write every sweep's results to this file")
    args = parser.parse_args(argv)

    cores = usable_cores()
    workers = default_workers(cores) if args.workers is None else [int(x) for x in args.workers.split(",")]
    sizes = [int(x) for x in str(args.num_envs).split(",")]
    if any(w < 1 for w in workers):
        parser.error(f"each worker count must be positive: {workers}")
    if max(workers) > cores:
        print(f"note: {max(workers)} workers on {cores} usable cores: the larger counts are oversubscribed",
              file=sys.stderr)
    workloads = args.workloads.split(",")
    engines = ["serial", *[e for e in args.engines.split(",") if e != "serial"]]
    max_procs = args.max_procs or max(workers)
    timing = Timing(seconds=args.seconds, repeats=args.repeats, warmup=0.2)
    sweeps: dict[int, SweepResult] = {}
    for w in workers:
        # Async collection needs equal blocks: a count that does not divide the sizes runs without it.
        engines_w = [e for e in engines if not (e.startswith("shmvec-async") and any(n % w for n in sizes))]
        print(f"{w} worker(s): {len(workloads)} workloads x {len(engines_w)} engines at {args.num_envs} envs",
              file=sys.stderr, flush=True)
        config = SweepConfig(workloads=workloads, engines=engines_w, num_envs=sizes, timing=timing,
                             num_workers=w, max_procs=max_procs, sizes_as_given=True)
        sweeps[w] = run_sweep(config, progress=False)
    for n in sizes:
        print(f"# shmvec scaling: {n} envs, {cores} usable cores\n")
        print(table(sweeps, n, columns(workloads, engines)) + "\n", flush=True)
    failed = [f"{w} workers: {r.workload} {r.engine}: {r.reason}" for w, s in sweeps.items()
              for r in s.results if r.status == "failed"]
    for line in failed:
        print(f"- failed: {line}")
    if args.json:
        write_study(args.json, {str(w): s.to_dict() for w, s in sweeps.items()})
    return sweeps


if __name__ == "__main__":
    main()
