"""Figures quoted in prose, computed from the sweep the docs are written from, so they cannot drift.

A page marks each figure it quotes with the query that computes it::

    it ran <!-- figure: ratio atari-like:* shmvec-rollout/shmvec-loop -->1.36-2.35x<!-- /figure --> a step loop

``shmvec bench --write-docs`` rewrites the text between the markers from the new sweep, and a
test checks every marked figure in README.md and docs/ against the sweep file in the repo
(:data:`DOCS_SWEEP`). A query names cells, ``W:N`` (workload ``W`` at ``N`` envs; ``N`` may list
sizes, ``8,32``, or be ``*``: every size where the figure was measured), then what to show:

``ratio CELLS E/P``
    Engine ``E``'s steps/s over ``P``'s (the median of the per-round ratios, as in the report):
    ``0.93x`` for one cell, the range ``1.04-1.31x`` over several.
``rate CELL E``
    Steps/s, rounded for prose: ``320k``.
``rows CELLS | C1 C2 ...``
    Markdown table rows, one per cell, labelled ``<workload label>, N``; each column ``C`` is an
    engine (its steps/s) or ``E/P`` (a ratio); ``-`` where it did not run.
``engines CELL E1,E2,... | P1 P2 ...``
    Markdown table rows, one per engine, labelled with its name: its steps/s, then its ratio
    over each ``P``.

A table's markers stand on lines of their own around the whole table; its header (the lines
up to the ``|---|`` one) is the page's, the rows are generated.

A query that starts ``in FILE`` reads another results file of the repository instead: a sweep
(``results.json``), or a file of sweeps keyed by worker count (``benchmarks/scaling.py
--json``), one of which ``FILE#KEY`` picks. For the latter, ``scaling CELLS | C1 C2 ...`` gives
one table row per worker count: the columns of each cell in turn. Any other JSON results file
(a study's, under ``benchmarks/``) is read by ``in FILE value PATH FORMAT``: ``PATH`` names
keys and list indices joined by dots (``0.pinned/plain.median``), ``FORMAT`` is ``ratio``
(``1.60x``), ``rate`` (``97,083``), ``compact`` (``97.1k``), ``range`` (a ``min``/``max``
pair: ``1.49-1.71``) or ``f0``-``f3`` (that many decimals: ``4.09``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shmvec.bench.report import format_rate, format_ratio
from shmvec.bench.sweep import SweepResult

__all__ = ["DOCS_SWEEP", "FIGURE", "FigureError", "Stale", "compute", "pages", "rewrite", "stale"]

# The sweep README.md and docs/ quote, relative to the repository root; `--write-docs` replaces it.
DOCS_SWEEP = "benchmarks/docs-sweep.json"

FIGURE = re.compile(r"<!-- figure: (?P<query>[^>]*?) -->(?P<text>.*?)<!-- /figure -->", re.S)


class FigureError(ValueError):
    """A figure query that does not parse, or names something the sweep did not measure."""


@dataclass(frozen=True)
class Stale:
    """A marked figure whose text differs from what the sweep gives."""

    query: str
    found: str
    expected: str


def _cells(sweep: SweepResult, tokens: list[str], measured: Callable[[str, int], bool]) -> list[tuple[str, int]]:
    """The (workload, size) pairs ``W:N`` tokens name; ``*`` takes the sizes where ``measured``."""
    out = []
    for token in tokens:
        workload, _, sizes = token.partition(":")
        if sizes == "*":
            found = [(workload, n) for n in sweep.sizes(workload) if measured(workload, n)]
            if not found:
                raise FigureError(f"{token!r}: nothing measured for workload {workload!r} in the sweep")
            out += found
            continue
        try:
            out += [(workload, int(n)) for n in sizes.split(",")]
        except ValueError:
            raise FigureError(f"cells are W:N, N numbers separated by commas or '*', got {token!r}") from None
    if not out:
        raise FigureError("the query names no cells (W:N)")
    return out


def _ratio(sweep: SweepResult, workload: str, n: int, pair: str) -> float | None:
    engine, _, peer = pair.partition("/")
    return sweep.ratio(workload, n, engine, peer) if peer else None


def _need(value: float | None, what: str, workload: str, n: int) -> float:
    if value is None:
        raise FigureError(f"no {what} for {workload} at {n} envs in the sweep")
    return value


def compact_rate(x: float) -> str:
    """Steps/s for prose: ``320k``, ``18.6k``, ``1309k``, ``950``."""
    if x >= 100_000:
        return f"{x / 1000:.0f}k"
    if x >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.0f}"


def _range(values: list[float]) -> str:
    lo, hi = format_ratio(min(values)), format_ratio(max(values))
    return lo if lo == hi else f"{lo[:-1]}-{hi}"


def _cell(sweep: SweepResult, workload: str, n: int, column: str) -> str:
    if "/" in column:
        return format_ratio(_ratio(sweep, workload, n, column))
    rate = sweep.rate(workload, n, column)
    return "-" if rate is None else compact_rate(rate)


_SEPARATOR = re.compile(r"^\|[-:| ]+\|$")


def _table(current: str, rows: list[str]) -> str:
    """``rows`` under the header of the table in ``current`` (the text between the markers)."""
    header = []
    for line in current.strip("\n").splitlines():
        header.append(line)
        if _SEPARATOR.match(line.strip()):
            return "\n" + "\n".join(header + rows) + "\n\n"
    raise FigureError("a table figure needs the table's header, up to its |---| line, between its markers")


def _study(root: Path, ref: str) -> SweepResult | dict[int, SweepResult]:
    """The sweep (or the sweeps by worker count) of results file ``ref`` (``FILE`` or ``FILE#KEY``)."""
    name, _, key = ref.partition("#")
    path = root / name
    if not path.exists():
        raise FigureError(f"no results file {name} under {root}")
    data = json.loads(path.read_text())
    if "results" in data:
        return SweepResult.from_dict(data)
    sweeps = {int(k): SweepResult.from_dict(v) for k, v in data.items()}
    if not key:
        return sweeps
    if int(key) not in sweeps:
        raise FigureError(f"{name} has no sweep {key} (it has {sorted(sweeps)})")
    return sweeps[int(key)]


def _value(data: Any, path: str, form: str) -> str:
    """The figure at ``path`` (keys and indices joined by dots) of a results file's ``data``."""
    node = data
    for part in path.split("."):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise FigureError(f"no {part!r} on the way to {path!r}") from None
    if form == "range":
        return f"{node['min']:.2f}-{node['max']:.2f}"
    formats = {"ratio": format_ratio, "rate": format_rate, "compact": compact_rate}
    formats.update({f"f{d}": (lambda x, d=d: f"{x:.{d}f}") for d in range(4)})  # type: ignore[misc]
    if form not in formats or not isinstance(node, int | float):
        raise FigureError(f"{path!r}: cannot show {node!r:.60} as {form!r}")
    return formats[form](float(node))


def compute(query: str, sweep: SweepResult, current: str = "", root: str | Path = ".") -> str:
    """The text of the figure ``query`` asks for (see the module docstring); ``current``: the
    text between its markers now, whose table header a table figure keeps; ``root``: where the
    files of ``in FILE`` queries are."""
    head, _, tail = query.partition("|")
    words, columns = head.split(), tail.split()
    if words[:1] == ["in"] and len(words) == 5 and words[2] == "value":
        path = Path(root) / words[1]
        if not path.exists():
            raise FigureError(f"no results file {words[1]} under {root}")
        return _value(json.loads(path.read_text()), words[3], words[4])
    if words[:1] == ["in"] and len(words) > 2:
        study = _study(Path(root), words[1])
        words = words[2:]
        if isinstance(study, dict):
            if words[0] != "scaling" or len(words) < 2 or not columns:
                raise FigureError(f"{query!r}: a file of sweeps by worker count takes 'scaling CELLS | COLUMNS'")
            lines = []
            for workers, one in sorted(study.items()):
                pairs = _cells(one, words[1:], lambda w, n: False)
                cells = [str(workers)] + [_cell(one, workload, size, c) for workload, size in pairs for c in columns]
                lines.append("| " + " | ".join(cells) + " |")
            return _table(current, lines)
        sweep = study
    kind = words[0] if words else ""
    tokens = [w for w in words[1:] if ":" in w]
    rest = [w for w in words[1:] if ":" not in w]
    if kind == "ratio" and tokens and len(rest) == 1 and not columns:
        pair = rest[0]
        where = _cells(sweep, tokens, lambda w, n: _ratio(sweep, w, n, pair) is not None)
        return _range([_need(_ratio(sweep, w, n, pair), f"ratio {pair}", w, n) for w, n in where])
    if kind == "rate" and len(tokens) == 1 and len(rest) == 1 and not columns:
        [(workload, n)] = _cells(sweep, tokens, lambda w, n: False)
        return compact_rate(_need(sweep.rate(workload, n, rest[0]), f"steps/s of {rest[0]}", workload, n))
    if kind == "rows" and tokens and not rest and columns:
        lines = []
        for w, n in _cells(sweep, tokens, lambda w, n: True):
            cells = [f"{sweep.workload_label(w)}, {n}"] + [_cell(sweep, w, n, c) for c in columns]
            lines.append("| " + " | ".join(cells) + " |")
        return _table(current, lines)
    if kind == "engines" and len(tokens) == 1 and len(rest) == 1 and columns:
        [(w, n)] = _cells(sweep, tokens, lambda w, n: False)
        lines = []
        for engine in rest[0].split(","):
            cells = [sweep.engine_label(engine), format_rate(_need(sweep.rate(w, n, engine), engine, w, n))]
            cells += [format_ratio(_ratio(sweep, w, n, f"{engine}/{p}")) for p in columns]
            lines.append("| " + " | ".join(cells) + " |")
        return _table(current, lines)
    raise FigureError(f"cannot read figure query {query!r} (see shmvec.bench.figures)")


def rewrite(text: str, sweep: SweepResult, root: str | Path = ".") -> str:
    """``text`` with every marked figure recomputed from ``sweep`` (and the files under ``root``)."""
    return FIGURE.sub(
        lambda m: f"<!-- figure: {m['query']} -->{compute(m['query'], sweep, m['text'], root)}<!-- /figure -->", text
    )


def stale(text: str, sweep: SweepResult, root: str | Path = ".") -> list[Stale]:
    """The marked figures of ``text`` that ``sweep`` (and the files under ``root``) give otherwise."""
    out = []
    for m in FIGURE.finditer(text):
        expected = compute(m.group("query"), sweep, m.group("text"), root)
        if m.group("text") != expected:
            out.append(Stale(m.group("query"), m.group("text"), expected))
    return out


def pages(root: str | Path) -> Iterable[Path]:
    """The pages that quote figures: ``README.md`` and ``docs/*.md`` under ``root``."""
    root = Path(root)
    readme = root / "README.md"
    return ([readme] if readme.exists() else []) + sorted((root / "docs").glob("*.md"))
