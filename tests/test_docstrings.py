"""The usage examples in the public docstrings run as written."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["shmvec", "shmvec.vector_env", "shmvec.make_vec", "shmvec.async_rollout",
                                    "shmvec.advantage", "shmvec.torch", "shmvec.baselines", "shmvec.pettingzoo",
                                    "shmvec.sb3", "shmvec.rollouts", "shmvec.states", "shmvec.diagnose"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


def test_no_measured_figures_in_code_comments():
    """Speed figures live in results files and the docs generated from them (they go stale in a
    comment): the code says why, not how fast it was once."""
    import io
    import re
    import tokenize
    from pathlib import Path

    measured = re.compile(r"measured:[^\n]*\d|\d+(\.\d+)? ?% (faster|slower|less|more)|\d+(\.\d+)?x (faster|slower)|ran about")
    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "shmvec").rglob("*.py")):
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            text = tok.string
            is_docstring = tok.type == tokenize.STRING and text.lstrip("rbuRBU").startswith(('"""', "'''"))
            if (tok.type == tokenize.COMMENT or is_docstring) and measured.search(text):
                found.append(f"{path.name}:{tok.start[0]}: {measured.search(text).group(0)!r}")
    assert not found, found


def test_architecture_module_table_lists_every_module():
    """docs/architecture.md's module table names every module of the package, and only those."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "architecture.md").read_text()
    table = text.split("## Modules", 1)[1].split("\n\n", 2)[1]
    named = set()
    for row in table.splitlines()[2:]:
        first_cell = row.split("|")[1]
        named |= {name.removeprefix("shmvec/") for name in re.findall(r"`([\w/]+\.py|\w+/)`", first_cell)}
    package = root / "shmvec"
    modules = {p.name for p in package.glob("*.py")} | {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    assert named == modules
