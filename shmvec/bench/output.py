"""Where a sweep's files go: ``results/<timestamp>/``, ``results/latest`` and ``docs/benchmarks.md``."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shmvec.bench.plots import plots_unavailable, write_plots
from shmvec.bench.report import render_markdown, write_json
from shmvec.bench.sweep import SweepResult

__all__ = ["BEGIN", "END", "ResultFiles", "docs_block", "update_docs", "write_results", "write_study"]

BEGIN = "<!-- latest-results:begin (written by `shmvec bench --write-docs`; edits here are overwritten) -->"
END = "<!-- latest-results:end -->"


@dataclass
class ResultFiles:
    """The files one sweep wrote."""

    folder: Path
    json: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)
    plot_note: str | None = None  # why there are no plots


def _stamp(started: str) -> str:
    try:
        return dt.datetime.fromisoformat(started).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _point_latest(root: Path, folder: Path) -> None:
    latest = root / "latest"
    if latest.is_symlink() or latest.is_file():
        latest.unlink()
    elif latest.is_dir():
        shutil.rmtree(latest)
    try:
        latest.symlink_to(folder.name, target_is_directory=True)  # relative: the tree can move
    except OSError:  # no symlinks here (some filesystems, Windows without rights): copy
        shutil.copytree(folder, latest)


def write_results(sweep: SweepResult, root: str | Path = "results", plots: bool = True) -> ResultFiles:
    """Write ``results.json``, ``results.md`` and the plots under ``root/<timestamp>/``; point ``root/latest`` at it."""
    root = Path(root)
    folder = root / _stamp(sweep.started)
    k = 1
    while folder.exists():
        k += 1
        folder = root / f"{_stamp(sweep.started)}-{k}"
    folder.mkdir(parents=True)
    files = ResultFiles(folder, folder / "results.json", folder / "results.md")
    write_json(sweep, files.json)
    if plots:
        files.plot_note = plots_unavailable()
        files.plots = write_plots(sweep, folder)
    else:
        files.plot_note = "plots skipped (--no-plots)"
    files.markdown.write_text(render_markdown(sweep, plots=[p.name for p in files.plots]))
    _point_latest(root, folder)
    return files


_DOCS_SKELETON = """# Benchmarks

## Latest results

{begin}
{end}
"""


def update_docs(
    sweep: SweepResult,
    docs_path: str | Path = "docs/benchmarks.md",
    plots: list[Path] | None = None,
    image_dir: str = "img/benchmarks",
) -> Path:
    """Rewrite the "Latest results" block of ``docs_path`` from ``sweep`` (copying the plots beside it).

    Only the text between :data:`BEGIN` and :data:`END` changes; a file without the markers
    gets the block appended, a missing file a minimal page.
    """
    docs_path = Path(docs_path)
    text = docs_path.read_text() if docs_path.exists() else _DOCS_SKELETON.format(begin=BEGIN, end=END)
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + "\n\n## Latest results\n\n" + BEGIN + "\n" + END + "\n"
    links = []
    if plots:
        target = docs_path.parent / image_dir
        target.mkdir(parents=True, exist_ok=True)
        for p in plots:
            shutil.copyfile(p, target / p.name)
            links.append(f"{image_dir}/{p.name}")
    body = render_markdown(sweep, plots=links, heading_level=3)
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    docs_path.parent.mkdir(parents=True, exist_ok=True)
    docs_path.write_text(head + BEGIN + "\n\n" + body + "\n" + END + tail)
    _update_figures(sweep, docs_path)
    return docs_path


def docs_block(text: str) -> str:
    """The text between :data:`BEGIN` and :data:`END` (what :func:`update_docs` writes)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def _update_figures(sweep: SweepResult, docs_path: Path) -> None:
    """Keep the sweep the pages quote in the repository, and recompute their marked figures.

    The repository root is the folder above ``docs/`` (or the page's own folder).
    """
    from shmvec.bench.figures import DOCS_SWEEP, pages, rewrite

    root = docs_path.parent.parent if docs_path.parent.name == "docs" else docs_path.parent
    target = root / DOCS_SWEEP
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(sweep, target)
    for page in pages(root):
        text = page.read_text()
        new = rewrite(text, sweep, root)
        if new != text:
            page.write_text(new)


def write_study(path: str | Path, data: Any) -> Path:
    """Write a study's figures (a ``benchmarks/*.py --json`` file, the kind the docs' ``in FILE``
    figures read) as JSON, making its folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def relpath(path: Path) -> str:
    """``path`` relative to the working directory where it is under it (for messages)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return str(Path(path).resolve()) if rel.startswith("..") else rel
