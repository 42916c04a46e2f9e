"""Instructions per env step, counted by valgrind's callgrind: figures this VM's noise cannot move.

    .venv/bin/python benchmarks/instructions.py                      # needs valgrind on PATH
    .venv/bin/python benchmarks/instructions.py --num-envs 8,32 --engines serial,shmvec-loop,shmvec-rollout

On a shared 2-core VM one engine's wall-clock windows differ by 20-40 % from one to the next,
far more than the few percent that separate, say, ``rollout`` from a step loop on CartPole.
Instructions retired do not move from run to run. Each engine is built as ``make bench`` builds
it, but with ``num_workers=0`` and ``step_in_main=True`` (``RunSpec.in_process``): shmvec then
steps its only block in the calling process, so callgrind sees all of the work, the envs' steps
and the engine's own.

Each cell runs the engine twice under callgrind, with ``A`` and ``B`` timed calls after the same
warm-up, and reports ``(I_B - I_A) / ((B - A) * steps_per_call * num_envs)``: the instructions
of one env step, start-up and shutdown cancelled out. Start-up itself varies by about +-4 million
instructions between identical runs (addresses, hashing), so ``--env-steps`` sets how many env
steps that is spread over: the default 40,000 keeps it near +-100 per env step. Only engines that start no process at
one worker qualify (the serial loop, gym Sync, shmvec step, step loop and rollout): what other
processes do, and time spent waiting, is not in a count of the calling process. The cells run
side by side, one per core: counts do not depend on load.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shmvec.bench.engines import RunSpec, get_engines, make_actions
from shmvec.bench.output import write_study
from shmvec.bench.workloads import get_workloads
from shmvec.checks import usable_cores

ENGINES = ["serial", "gym-sync", "shmvec", "shmvec-loop", "shmvec-rollout"]
WITH_WORKERS = ["shmvec-main", "split-serial", "shmvec-async"]  # engines that start processes: only with --workers
# (column title, engine, peer): instructions of the engine over the peer's
RATIOS = [
    ("shmvec / serial", "shmvec", "serial"),
    ("rollout / step loop", "shmvec-rollout", "shmvec-loop"),
]
WARMUP_CALLS = 2
_COUNT = re.compile(r"Collected\s*:\s*(\d+)")


def child(engine_key: str, workload_key: str, num_envs: int, calls: int, workers: int) -> None:
    """Build one engine, warm it up, make ``calls`` timed calls, close it (run under callgrind).

    ``workers=0``: one block, in the calling process. Otherwise shmvec's defaults with that many
    workers, every env in a worker, and waits that block at once (``spin_us=0``: a spinning
    wait's instructions measure idle time, not work).
    """
    engine = get_engines([engine_key])[0]
    workload = get_workloads([workload_key])[0]
    if workers:
        spec = RunSpec(workload, num_envs, num_workers=workers, spin_us=0.0)
    else:
        spec = RunSpec(workload, num_envs, num_workers=1, in_process=True)
    driver = engine.build(spec)
    try:
        probe = spec.workload.make_env()
        actions = make_actions(probe.action_space, num_envs, seed=0)
        probe.close()
        driver.reset(seed=0)
        for i in range(WARMUP_CALLS + calls):
            driver.step(actions[i % len(actions)])
    finally:
        driver.close()
    print("steps_per_call", getattr(driver, "steps_per_call", 1))


def count(engine: str, workload: str, num_envs: int, calls: int, workers: int) -> tuple[int, int, int]:
    """Instructions of one child run under callgrind, the engine's vector steps per call, and how
    many processes reported. Forked workers stay under callgrind: with ``workers`` their counts
    are added in."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
           "--child", engine, workload, str(num_envs), str(calls), str(workers)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = _COUNT.findall(out.stderr)
    if out.returncode != 0 or not found or (not workers and len(found) != 1):
        raise RuntimeError(f"{engine} {workload} N={num_envs}: callgrind run failed "
                           f"(exit {out.returncode}):\n{out.stderr[-2000:]}")
    return sum(int(c) for c in found), int(out.stdout.split("steps_per_call")[-1]), len(found)


def per_env_step(engine: str, workload: str, num_envs: int, env_steps: int, workers: int = 0) -> float:
    """Instructions per env step: the difference of two runs, ``A`` and ``B`` calls.

    Both runs must report the same processes: a worker stopped before callgrind wrote its count
    (a slow exit under a loaded machine) would make the difference meaningless, so the pair is
    measured again."""
    for _ in range(3):
        small, spc, procs = count(engine, workload, num_envs, 1, workers)
        extra = max(1, round(env_steps / (num_envs * spc)))
        large, _, procs_large = count(engine, workload, num_envs, 1 + extra, workers)
        if procs == procs_large:
            return (large - small) / (extra * spc * num_envs)
    raise RuntimeError(f"{engine} {workload} N={num_envs}: the two runs reported {procs} and {procs_large} "
                       "processes three times: a worker's count keeps going missing")


def main(argv: list[str] | None = None) -> dict[tuple[str, str, int], float]:
    """Run the cells, print the table; returns ``{(workload, engine, num_envs): instructions per env step}``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="cartpole", help="comma-separated (default: cartpole)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, from {ENGINES}")
    parser.add_argument("--num-envs", default="8,32", help="comma-separated sizes (default: 8,32)")
    parser.add_argument("--env-steps", type=int, default=40000,
                        help="env steps between the two runs of a cell (default 40000)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--workers", type=int, default=0, help="0 (default): every env in the calling process; "
                        "W: shmvec's defaults with W workers, the calling process and its workers counted together")
    parser.add_argument("--child", nargs=5, metavar=("ENGINE", "WORKLOAD", "N", "CALLS", "WORKERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        engine, workload, n, calls, workers = args.child
        child(engine, workload, int(n), int(calls), int(workers))
        return {}
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind on PATH (apt install valgrind)")
    engines = args.engines.split(",")
    allowed = ENGINES if not args.workers else [*ENGINES, *WITH_WORKERS]
    bad = [e for e in engines if e not in allowed]
    if bad:
        parser.error(f"engines {bad} start processes at one worker or are unknown; choose from {allowed}"
                     + ("" if args.workers else " (or use --workers)"))
    sizes = [int(n) for n in args.num_envs.split(",")]
    cells = [(w, e, n) for w in args.workloads.split(",") for n in sizes for e in engines]
    with ThreadPoolExecutor(usable_cores()) as pool:
        figures = dict(zip(cells, pool.map(lambda c: per_env_step(c[1], c[0], c[2], args.env_steps, args.workers),
                                           cells)))
    print("| workload | num_envs | " + " | ".join(engines) + "".join(f" | {t}" for t, e, p in RATIOS
                                                              if e in engines and p in engines) + " |")
    print("|---|---:|" + "---:|" * (len(engines) + sum(e in engines and p in engines for _, e, p in RATIOS)))
    for w in args.workloads.split(","):
        for n in sizes:
            row = [f"{figures[(w, e, n)]:,.0f}" for e in engines]
            row += [f"{figures[(w, e, n)] / figures[(w, p, n)]:.3f}" for _, e, p in RATIOS
                    if e in engines and p in engines]
            print(f"| {w} | {n} | " + " | ".join(row) + " |")
    if args.workers:
        print(f"\ninstructions per env step (callgrind, the calling process and its {args.workers} workers, "
              "waits that block at once)")
    else:
        print("\ninstructions per env step (callgrind, calling process, num_workers=0: every env in it)")
    if args.json:
        write_study(args.json, [{"workload": w, "engine": e, "num_envs": n, "instructions_per_env_step": v}
                                for (w, e, n), v in figures.items()])
    return figures


if __name__ == "__main__":
    main()
