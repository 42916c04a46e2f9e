"""PNG plots of a sweep: steps/s against num_envs per workload, one line per engine.

matplotlib is optional (``pip install 'shmvec[plot]'``): without it no plot is written and the
caller is told why, nothing fails.
"""

from __future__ import annotations

from pathlib import Path

from shmvec.bench.sweep import SweepResult

__all__ = ["plots_unavailable", "write_plots"]


def plots_unavailable() -> str | None:
    """Why plots cannot be drawn here (matplotlib missing), or ``None``."""
    try:
        import matplotlib  # noqa: F401
    except Exception as exc:
        return f"plots skipped: matplotlib is not available ({type(exc).__name__}: {exc}); pip install 'shmvec[plot]'"
    return None


def write_plots(sweep: SweepResult, folder: str | Path) -> list[Path]:
    """Write ``<folder>/<workload>.png`` for each workload; returns the files written (none without matplotlib)."""
    if plots_unavailable():
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for w in sweep.workloads():
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        drawn = False
        for e in sweep.engines():
            points = [(n, sweep.rate(w, n, e)) for n in sweep.sizes(w)]
            points = [(n, r) for n, r in points if r is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            style = "--" if e == "serial" else "-"
            width = 2.5 if e == "shmvec" else 1.3
            ax.plot(xs, ys, style, marker="o", linewidth=width, markersize=4, label=sweep.engine_label(e))
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sweep.sizes(w), [str(n) for n in sweep.sizes(w)])
        ax.set_xlabel("num_envs")
        ax.set_ylabel("env steps / s (median)")
        ax.set_title(f"{sweep.workload_label(w)}: {sweep.machine.get('usable_cores')} cores")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / f"{w}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
