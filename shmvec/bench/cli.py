"""The ``shmvec`` command: ``shmvec bench`` (throughput report) and ``shmvec tune`` (best configuration)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_parser", "main"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from shmvec import __version__

    parser = argparse.ArgumentParser(prog="shmvec", description="shmvec benchmarks and tuning.")
    parser.add_argument("--version", action="version", version=f"shmvec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{bench,tune}")
    sub.required = True

    b = sub.add_parser(
        "bench",
        help="throughput report: shmvec against Gymnasium, the classic baseline and peers",
        description="Run the throughput sweep and print a markdown report; results go to "
        "OUT/<timestamp>/ (JSON, markdown, PNG plots) and OUT/latest.",
    )
    # The defaults named in the help texts are the presets' own values.
    from shmvec.bench.sweep import SweepConfig

    full, quick, standard = SweepConfig.full(), SweepConfig.quick_preset(), SweepConfig.standard()
    sizes = [",".join(map(str, c.num_envs)) for c in (standard, full, quick)]
    b.add_argument("--quick", action="store_true", help="small sweep, short windows (a smoke test, not figures)")
    b.add_argument(
        "--full",
        action="store_true",
        help="every engine (default: shmvec's defaults against the vector envs users run today, and the ceiling)",
    )
    b.add_argument("--workloads", type=_names, metavar="A,B", help="workloads to run (see --list)")
    b.add_argument("--engines", type=_names, metavar="A,B", help="engines to run (see --list)")
    b.add_argument(
        "--num-envs",
        type=_ints,
        metavar="N,M",
        help=f"sizes to sweep (default {sizes[0]}; --full {sizes[1]}; quick {sizes[2]})",
    )
    b.add_argument(
        "--seconds",
        type=_positive,
        help=f"length of one measurement window (default {full.timing.seconds:g}; quick {quick.timing.seconds:g})",
    )
    b.add_argument(
        "--repeats",
        type=int,
        help=f"windows per cell; the median is reported (default {full.timing.repeats}; quick {quick.timing.repeats})",
    )
    b.add_argument(
        "--warmup",
        type=float,
        help=f"warm-up seconds before the windows (default {full.timing.warmup:g}; quick {quick.timing.warmup:g})",
    )
    b.add_argument(
        "--num-workers",
        type=int,
        help="blocks of envs stepped at once (default: usable cores): shmvec's num_workers, "
        "less one for the engines whose calling process steps a block",
    )
    b.add_argument(
        "--max-procs", type=int, help="skip engines that would start more processes than this (default 128; quick 32)"
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", default="results", metavar="DIR", help="results folder (default ./results)")
    b.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    b.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    b.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the check of how CPU-bound work scales over processes (before and after the sweep)",
    )
    b.add_argument(
        "--write-docs",
        nargs="?",
        const="docs/benchmarks.md",
        metavar="PATH",
        help="also rewrite the 'Latest results' block of docs/benchmarks.md (or PATH)",
    )
    b.add_argument(
        "--from-json", metavar="PATH", help="do not measure: render the report (and --write-docs) from a results.json"
    )
    b.add_argument("--list", action="store_true", help="list workloads and engines (and which are installed)")
    b.add_argument("--dry-run", action="store_true", help="print the plan and the time it should take, run nothing")

    t = sub.add_parser(
        "tune",
        help="find the fastest shmvec configuration for an env on this machine",
        description="Measure num_workers x envs_per_worker x step_in_main x spin_us for ENV_ID "
        "and print the fastest configuration with every env in a worker as code, and how much "
        "faster step_in_main=True would be (about a minute).",
    )
    t.add_argument("env_id", help="Gymnasium env id, e.g. CartPole-v1 or shmvec/AtariLike-v0")
    t.add_argument("--num-envs", type=int, help="the num_envs you will use (default: also search it)")
    t.add_argument("--workers", type=_ints, metavar="A,B", help="num_workers values to try")
    t.add_argument(
        "--env-kwargs",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="keyword arguments for gymnasium.make, e.g. '{\"step_us\": 50}'",
    )
    t.add_argument("--seconds", type=_positive, default=0.5, help="window length (default 0.5)")
    t.add_argument("--repeats", type=int, default=2, help="windows per configuration (default 2)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--no-probe", action="store_true", help="skip the check of how CPU-bound work scales")
    return parser


def _config(args: argparse.Namespace):  # -> SweepConfig
    from shmvec.bench.measure import Timing
    from shmvec.bench.sweep import SweepConfig

    base = SweepConfig.quick_preset() if args.quick else SweepConfig.full() if args.full else SweepConfig.standard()
    timing = Timing(
        seconds=args.seconds if args.seconds is not None else base.timing.seconds,
        repeats=args.repeats if args.repeats is not None else base.timing.repeats,
        warmup=args.warmup if args.warmup is not None else base.timing.warmup,
    )
    return SweepConfig(
        workloads=args.workloads,
        engines=args.engines or base.engines,
        timing=timing,
        num_envs=args.num_envs or base.num_envs,
        num_workers=args.num_workers,
        max_procs=args.max_procs if args.max_procs is not None else base.max_procs,
        seed=args.seed,
        quick=args.quick,
        probe_scaling=not args.no_probe,
    )


def _list() -> str:
    from shmvec.bench.engines import ENGINES
    from shmvec.bench.workloads import WORKLOADS

    lines = ["workloads:"]
    lines += [f"  {w.key:<12} {w.label:<22} {w.description}" for w in WORKLOADS.values()]
    lines.append("engines:")
    for e in ENGINES.values():
        missing = e.unavailable()
        lines.append(f"  {e.key:<15} {e.description}" + (f"  [{missing}]" if missing else ""))
    return "\n".join(lines)


def _bench(args: argparse.Namespace) -> int:
    from shmvec.bench.output import relpath, update_docs, write_results
    from shmvec.bench.plots import plots_unavailable, write_plots
    from shmvec.bench.progress import format_duration
    from shmvec.bench.report import load_json, render_markdown
    from shmvec.bench.sweep import plan_sweep, run_sweep

    if args.list:
        print(_list())
        return 0
    if args.from_json:
        sweep = load_json(args.from_json)
        plots: list[Path] = []
        note = "plots skipped (--no-plots)" if args.no_plots else plots_unavailable()
        if not args.no_plots:
            plots = write_plots(sweep, Path(args.from_json).parent)
        print(render_markdown(sweep, plots=[str(p) for p in plots]))
    else:
        try:
            config = _config(args)
            plan = plan_sweep(config)
        except ValueError as exc:
            print(f"shmvec bench: {exc}", file=sys.stderr)
            return 2
        runs = [p for p in plan if p.skip is None]
        total = sum(p.estimate_s for p in runs)
        print(
            f"shmvec bench: {len(runs)} runs ({len(plan) - len(runs)} skipped), about {format_duration(total)}",
            file=sys.stderr,
        )
        if args.dry_run:
            for p in plan:
                print(f"  {p.label:<45} " + (f"skip: {p.skip}" if p.skip else f"~{p.estimate_s:.1f} s"))
            return 0
        sweep = run_sweep(config, progress=not args.no_progress, plan=plan)
        files = write_results(sweep, args.out, plots=not args.no_plots)
        plots, note = files.plots, files.plot_note
        print(render_markdown(sweep, plots=[relpath(p) for p in plots]))
        print(
            f"results: {relpath(files.folder)}/ (results.json, results.md, {len(plots)} plots); "
            f"also {relpath(Path(args.out) / 'latest')}",
            file=sys.stderr,
        )
    if note:
        print(note, file=sys.stderr)
    if args.write_docs:
        path = update_docs(sweep, args.write_docs, plots=plots)
        print(f"updated {relpath(path)}", file=sys.stderr)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from shmvec.bench.tuning import tune

    try:
        result = tune(
            args.env_id,
            args.num_envs,
            env_kwargs=args.env_kwargs,
            workers=args.workers,
            seconds=args.seconds,
            repeats=args.repeats,
            progress=not args.no_progress,
            probe=not args.no_probe,
        )
    except Exception as exc:  # an unknown id, bad kwargs: say so without a traceback
        print(f"shmvec tune: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0 if result.best is not None else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``shmvec``, ``python -m shmvec`` and ``python -m shmvec.bench``."""
    args = build_parser().parse_args(argv)
    try:
        return _bench(args) if args.command == "bench" else _tune(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
