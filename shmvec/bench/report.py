"""Turn a :class:`~shmvec.bench.sweep.SweepResult` into markdown tables and JSON."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from shmvec.bench.engines import CEILING
from shmvec.bench.machine import machine_line
from shmvec.bench.measure import RunResult, spread
from shmvec.bench.sweep import SweepResult
from shmvec.bench.targets import Target, evaluate

__all__ = [
    "format_rate",
    "format_ratio",
    "full_table",
    "load_json",
    "markdown_table",
    "render_markdown",
    "summary_table",
    "targets_table",
    "write_json",
]

ENGINE = "shmvec"  # the engine every speedup is computed for
REFERENCE = "serial"  # the per-core reference


def format_rate(x: float | None) -> str:
    """``1234567.8`` -> ``"1,234,568"``; ``None`` -> ``"-"``."""
    return "-" if x is None else f"{x:,.0f}"


def format_ratio(x: float | None) -> str:
    """``3.14159`` -> ``"3.14x"``, ``31.4`` -> ``"31.4x"``; ``None`` -> ``"-"``."""
    if x is None:
        return "-"
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def markdown_table(header: list[str], align: str, rows: list[list[str]]) -> str:
    """A markdown table; ``align`` holds one ``l``/``r`` per column."""
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _never_ran(sweep: SweepResult) -> dict[str, str]:
    """Engines skipped at every cell for the same reason (not installed): listed once, not per row."""
    out = {}
    for engine in sweep.engines():
        rs = [r for r in sweep.results if r.engine == engine]
        reasons = {r.reason for r in rs}
        if rs and all(r.status == "skipped" for r in rs) and len(reasons) == 1 and "capped" not in rs[0].reason:
            out[engine] = rs[0].reason
    return out


def _shown_engines(sweep: SweepResult) -> list[str]:
    hidden = _never_ran(sweep)
    return [e for e in sweep.engines() if e not in hidden]


def _cell_note(sweep: SweepResult, workload: str, n: int, engine: str) -> str:
    r = sweep.get(workload, n, engine)
    if r is None:
        return "-"
    return "skipped" if r.status == "skipped" else "failed" if r.status == "failed" else "-"


def _scaling(sweep: SweepResult) -> tuple[int, float, float, int] | None:
    """``(processes, median, lowest, samples)`` of the parallel-capacity probes, if any."""
    s = sweep.machine.get("parallel_scaling") or {}
    values = [v for v in s.get("samples", []) if isinstance(v, (int, float))]
    k = int(s.get("processes", 0))
    if not values or k < 2:
        return None
    return k, statistics.median(values), min(values), len(values)


def scaling_text(sweep: SweepResult) -> str | None:
    """What the machine's own parallel capacity was during the run (``None`` if not probed)."""
    c = _scaling(sweep)
    if c is None:
        return None
    k, median, lowest, count = c
    probes = f"median of {count} probes during the sweep, lowest {format_ratio(lowest)}" if count > 1 else "one probe"
    text = (
        f"Parallel capacity: CPU-bound work in {k} processes ran {format_ratio(median)} as fast as in one "
        f"process ({probes}; ideal {k}x). No engine can beat the serial loop by more than that here."
    )
    if median < 0.8 * k:
        text = (
            "**Warning: this machine did not deliver its cores.** " + text + " The machine was busy, or its "
            "vCPUs share physical cores: rerun on an idle machine before trusting the parallel figures."
        )
    elif lowest < 0.8 * k:
        text += (
            " At least one probe fell well short: something else ran for part of the sweep; "
            "cells with a large spread may be affected."
        )
    return text


def targets_table(sweep: SweepResult, targets: list[Target] | None = None) -> str:
    """Target, measured, met/missed: computed from the ratios of this run."""
    rows = []
    c = _scaling(sweep)
    for o in evaluate(sweep, targets):
        status = {"met": "met", "missed": "**missed**"}.get(o.status, o.status)
        detail = o.detail
        t = o.target
        if t.peer == "serial" and t.num_envs is not None and o.ratio is not None:
            # This workload's own ceiling where measured: its serial loop split over the cores.
            split = sweep.ratio(t.workload, t.num_envs, CEILING, "serial")
            if split is not None:
                detail += f" (ceiling, {sweep.engine_label(CEILING)}: {format_ratio(split)})"
            elif c is not None:
                detail += f" (machine ceiling {format_ratio(c[1])})"
        rows.append([o.target.text, detail, status])
    return markdown_table(["target", "measured", "status"], "llr", rows)


def summary_table(sweep: SweepResult) -> str:
    """One row per (workload, num_envs): shmvec's steps/s and its speedup against every engine."""
    peers = [e for e in _shown_engines(sweep) if e != ENGINE]
    header = ["workload", "num_envs", f"{sweep.engine_label(ENGINE)} steps/s"]
    header += [f"vs {sweep.engine_label(p)}" for p in peers]
    rows = []
    for w in sweep.workloads():
        for n in sweep.sizes(w):
            mine = sweep.rate(w, n, ENGINE)
            row = [sweep.workload_label(w), str(n), format_rate(mine) if mine else _cell_note(sweep, w, n, ENGINE)]
            for p in peers:
                ratio = sweep.ratio(w, n, ENGINE, p)
                row.append(format_ratio(ratio) if ratio is not None else _cell_note(sweep, w, n, p))
            rows.append(row)
    return markdown_table(header, "lrr" + "r" * len(peers), rows)


def _mem_column(sweep: SweepResult) -> tuple[Callable[[RunResult], float | None], str]:
    """How to read each run's memory, and the column's title: the most telling figure all runs have."""
    ok = [r for r in sweep.results if r.ok]
    if ok and all(r.added_mb("pss") is not None for r in ok):
        return (lambda r: r.added_mb("pss")), "mem MB added (PSS)"
    if ok and all(r.added_mb("rss") is not None for r in ok):
        return (lambda r: r.added_mb("rss")), "mem MB added (RSS)"
    if ok and all(r.pss_mb is not None for r in ok):  # results written before the baseline existed
        return (lambda r: r.pss_mb), "mem MB (PSS)"
    return (lambda r: r.rss_mb), "mem MB (RSS)"


def full_table(sweep: SweepResult) -> str:
    """Every (workload, num_envs, engine): steps/s, spread, ratios, memory, and why a cell is empty."""
    mem_of, mem_label = _mem_column(sweep)
    header = [
        "workload",
        "num_envs",
        "engine",
        "steps/s",
        "spread",
        "x serial",
        f"{sweep.engine_label(ENGINE)} speedup",
        mem_label,
        "note",
    ]
    rows = []
    for w in sweep.workloads():
        for n in sweep.sizes(w):
            for e in _shown_engines(sweep):
                r = sweep.get(w, n, e)
                if r is None:
                    continue
                label = sweep.engine_label(e)
                if r.workers and e == ENGINE:
                    label += f" ({r.workers} workers)"
                if not r.ok:
                    rows.append(
                        [sweep.workload_label(w), str(n), label, "-", "", "", "", "", f"{r.status}: {r.reason}"]
                    )
                    continue
                s = spread(r.repeats)
                mem = mem_of(r)
                rows.append(
                    [
                        sweep.workload_label(w),
                        str(n),
                        label,
                        format_rate(r.steps_per_s),
                        "" if s is None else f"±{100 * s:.0f}%",
                        format_ratio(sweep.ratio(w, n, e, REFERENCE)),
                        format_ratio(sweep.ratio(w, n, ENGINE, e)),
                        "" if mem is None else f"{mem:,.0f}",
                        "",
                    ]
                )
    return markdown_table(header, "lrlrrrrrl", rows)


def method_text(sweep: SweepResult) -> str:
    """How the figures were measured, from the run's own configuration."""
    c = sweep.config
    t = c.get("timing", {})
    return (
        f"Each cell: build the engine, `reset(seed={c.get('seed', 0)})`, step {t.get('warmup')} s to warm up, "
        f"then {t.get('repeats')} window(s) of {t.get('seconds')} s stepping pre-generated random valid actions; "
        "steps/s = num_envs x vector steps / elapsed, the median of the windows (spread: half their range); "
        "on a multi-agent workload num_envs counts env copies and steps/s agent steps (a row per agent). "
        f"The engines that start at most {c.get('num_workers')} processes (shmvec's modes, the serial loop, split "
        "serial, gym Sync, SuperSuit, EnvPool) are built together at each size, warmed up again in turn, and take "
        "their windows in turn, one round "
        "after another (the order rotating), so a change in the machine's speed hits them alike; a ratio "
        "between two of them is the median of its per-round ratios. The process-per-env peers run after them, "
        "one at a time. "
        f"shmvec: `num_workers={c.get('num_workers')}` (the usable cores), every env in a worker (the defaults); "
        "gym Async, classic and SB3 Subproc, TorchRL Parallel: one process per env (as their docs advise); "
        f"engines that would start more than {c.get('max_procs')} processes are skipped at that size. "
        "x serial: steps/s over the serial loop's (one process, no vector env) in the same run; "
        "shmvec speedup: shmvec's steps/s over that engine's, same run (> 1: shmvec is faster). "
        "Memory added: the PSS of the benchmark process and all its children after the engine's warm-up, "
        "less the same just before it was built (what the engine itself costs)."
    )


def render_markdown(sweep: SweepResult, plots: list[str] | None = None, heading_level: int = 1) -> str:
    """The whole report: machine, targets, speedup summary, all measurements, skipped engines, plots."""
    h = "#" * heading_level
    hh = h + "#"
    quick = " (quick sweep: short windows, indicative only)" if sweep.config.get("quick") else ""
    scaling = scaling_text(sweep)
    parts = [
        f"{h} shmvec throughput report{quick}",
        f"Measured {sweep.started} in {sweep.elapsed_s:.0f} s on: {machine_line(sweep.machine)}.",
        *([scaling] if scaling else []),
        method_text(sweep),
        f"{hh} Targets",
        "Set for shmvec with 2 workers on 2 cores; checked against the ratios measured in this run."
        + (
            "" if sweep.config.get("num_workers") == 2 else f" This run used {sweep.config.get('num_workers')} workers."
        ),
        targets_table(sweep),
        f"{hh} shmvec against each engine",
        "Speedup = shmvec steps/s / engine steps/s, both measured in this run (> 1: shmvec is faster).",
        summary_table(sweep),
        f"{hh} All measurements",
        full_table(sweep),
    ]
    never = _never_ran(sweep)
    if never:
        parts.append(f"{hh} Engines not run")
        parts.append("\n".join(f"- {sweep.engine_label(e)}: {why}" for e, why in never.items()))
    if plots:
        parts.append(f"{hh} Plots")
        parts.append("\n\n".join(f"![{Path(p).stem}]({p})" for p in plots))
    return "\n\n".join(parts) + "\n"


def write_json(sweep: SweepResult, path: str | Path) -> Path:
    """Write ``sweep`` as JSON (the input of ``shmvec bench --from-json``)."""
    path = Path(path)
    path.write_text(json.dumps(sweep.to_dict(), indent=1) + "\n")
    return path


def load_json(path: str | Path) -> SweepResult:
    """Read a sweep written by :func:`write_json`."""
    return SweepResult.from_dict(json.loads(Path(path).read_text()))
