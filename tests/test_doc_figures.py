"""Every figure README.md and docs/ quote from a sweep comes from the sweep kept in the repo.

``shmvec bench --write-docs`` writes the "Latest results" block of docs/benchmarks.md, recomputes
every marked figure (:mod:`shmvec.bench.figures`) and keeps the sweep as
``benchmarks/docs-sweep.json``; these tests fail when a page and that file disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from shmvec.bench.figures import DOCS_SWEEP, FIGURE, pages, stale
from shmvec.bench.output import docs_block
from shmvec.bench.report import load_json, render_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results-2core"
FIX = f"rerun `shmvec bench --write-docs`, or `shmvec bench --from-json {DOCS_SWEEP} --write-docs` after an edit"


def test_marked_figures_match_the_sweep_the_docs_quote():
    sweep = load_json(ROOT / DOCS_SWEEP)
    found = {page.relative_to(ROOT).as_posix(): stale(page.read_text(), sweep, ROOT) for page in pages(ROOT)}
    wrong = [f"{name}: {s.query!r} says {s.found!r}, the sweep {s.expected!r}" for name, ss in found.items() for s in ss]
    assert not wrong, "\n".join(wrong) + "\n" + FIX
    counts = {name: len(FIGURE.findall((ROOT / name).read_text())) for name in found}
    # The pages that quote the sweep in prose keep doing it through markers.
    for name in ("README.md", "docs/benchmarks.md", "docs/reliability.md", "docs/async.md", "docs/multiagent.md"):
        assert counts[name] > 0, name


def test_latest_results_block_is_the_report_of_that_sweep():
    sweep = load_json(ROOT / DOCS_SWEEP)
    block = docs_block((ROOT / "docs/benchmarks.md").read_text())
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", block)
    assert all((ROOT / "docs" / link).exists() for link in links), links
    assert block == "\n\n" + render_markdown(sweep, plots=links, heading_level=3) + "\n", FIX


def study(name: str):
    """The benchmark script ``benchmarks/<name>.py``, imported (its folder on the path while it
    loads: some import a script beside them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_study", ROOT / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def results(name: str):
    """``benchmarks/results-2core/<name>.json``, read."""
    import json

    return json.loads((RESULTS / f"{name}.json").read_text())


def between(page: str, marker: str) -> str:
    """What ``docs/<page>`` holds between ``<!-- <marker>:begin -->`` and its end marker."""
    text = (ROOT / "docs" / page).read_text()
    return text.split(f"<!-- {marker}:begin -->\n", 1)[1].split(f"\n<!-- {marker}:end -->", 1)[0]


def test_ppo_wall_time_table_is_its_results_file():
    rows = results("ppo_wall_time")
    assert between("migration.md", "ppo-wall-time") == study("ppo_wall_time").format_table(rows)
    assert all(row["same_run"] for row in rows)  # each pair trained identically


def test_caller_cost_tables_are_their_results_file():
    """docs/benchmarks.md's table of the caller's work per round, and the projection built on
    it, are benchmarks/results-2core/caller_cost.json's (`make bench-caller-cost` writes them)."""
    cost = study("caller_cost")
    rows = results("caller_cost")
    blocks = cost.docs_blocks((ROOT / "docs/benchmarks.md").read_text())
    assert blocks == {name: make(rows) + "\n" for name, make in cost.BLOCKS.items()}
    assert {r["workers"] for r in rows} >= {2, 16, 32} and {r["obs"] for r in rows} == set(cost.OBS)
    assert all({"cpu_us", "cpu_shared_us", "early_copy_us", "blocks_after_last"} <= set(r) for r in rows)
    # What the text says of the file: the caller's CPU per round, with a core of its own, within
    # 1.5x of its CPU at 2 workers up to 32 (not with every core shared); about one block's
    # frames left to copy after the round when blocks finish apart.
    own = {(r["obs"], r["workers"]): r for r in rows}
    assert all(own["none", w]["cpu_us"] <= 1.5 * own["none", 2]["cpu_us"] for w in (4, 8, 16, 32))
    assert own["none", 32]["cpu_shared_us"] > 1.5 * own["none", 2]["cpu_shared_us"]
    assert all(own["pong-300us", w]["blocks_after_last"] < 1.5 for w in (2, 16, 32))


def test_round_instruction_table_is_its_results_file():
    """docs/benchmarks.md's table of the caller's instructions per round against an earlier
    commit is benchmarks/results-2core/round_instructions_ab.json's."""
    result = results("round_instructions_ab")
    assert between("benchmarks.md", "round-ab") == study("round_instructions_ab").format_table(result)
    # What the text says of the file: the path itself no dearer, the race in the sleeps.
    cells = result["cells"]
    assert cells["step"]["ratio"] < 1.0 and cells["send/sleep/recv"]["ratio"] < 1.0
    assert cells["send/recv"]["sleeps"]["this"] > cells["send/recv"]["sleeps"]["base"]


def test_round_cut_table_is_its_results_file():
    """docs/benchmarks.md's before/after of #53's round ("Where a round's instructions go") is
    benchmarks/results-2core/round_instructions_53.json's, and the cut it claims holds there."""
    result = results("round_instructions_53")
    assert between("benchmarks.md", "round-cut") == study("round_instructions_ab").format_table(result)
    cells = result["cells"]
    assert cells["step"]["ratio"] < 1 / 3 and cells["step"]["this"] <= 35_000  # "less than a third", "against 35,000"
    assert cells["send/recv"]["ratio"] <= 0.62 and cells["send/sleep/recv"]["ratio"] <= 0.71  # "38 % and 29 % fewer"


def test_round_floor_table_is_its_results_file():
    """docs/benchmarks.md's `step` against the bare round trip ("A `step` against the floor") is
    benchmarks/results-2core/round_floor.json's, its median the median of its repeats."""
    result = results("round_floor")
    assert between("benchmarks.md", "round-floor") == study("round_floor").format_table(result)
    ratios = sorted(r["ratio"] for r in result["repeats"])
    assert result["median_ratio"] == ratios[len(ratios) // 2] and result["median_ratio"] > 1


def test_start_method_tables_are_their_results_files():
    """docs/architecture.md's start-method costs ("The start method") are
    benchmarks/results-2core/start_methods-py311.json's and -py314.json's, and what the text
    says of them holds there."""
    files = [results(f"start_methods-{py}") for py in ("py311", "py314")]
    format_table = study("start_methods").format_table
    assert between("architecture.md", "start-methods") == "\n\n".join(format_table(r) for r in files)
    for result in files:
        cells = result["cells"]
        # "Forked, 3 to 7 times faster than from the forkserver and 9 to 19 times faster than
        # spawned" (the next vector env and the restart: the first includes the server's start).
        for key in ("rebuild_s", "restart_s"):
            fork = cells["fork"][key]
            assert 2.5 <= cells["forkserver"][key] / fork < 7.5, (result["python"], key)
            assert 8.5 <= cells["spawn"][key] / fork < 19.5, (result["python"], key)
        # the default starts as fork does from one thread, and from the forkserver from several
        assert cells["default, one thread"]["started_by"] == "fork"
        assert cells["default, threaded"]["started_by"] == "forkserver"
        # shmvec's preload makes a start from the forkserver cheaper than Python's own alone
        assert cells["forkserver"]["restart_s"] < cells["forkserver, Python's preload"]["restart_s"]


def test_round_phase_tables_are_their_results_file():
    """docs/benchmarks.md's tables of where a round's instructions go ("Where a round's
    instructions go") are benchmarks/results-2core/round_phases.json's, and the text's claims
    about them hold there."""
    result = results("round_phases")
    assert between("benchmarks.md", "round-phases") == study("round_phases").format_table(result)
    for kind, cell in result["cells"].items():
        # "A wrapped call costs the functions around it about 200 instructions"
        assert 100 < cell["wrapper_cost_per_call"] < 300, kind
        # the top rows (the round's calls) hold what the caller does, give or take its sleeps
        top = sum(row["instructions"] for row in cell["rows"] if row["depth"] == 0)
        assert 0.9 < top / cell["total_unwrapped"] < 1.15, kind
