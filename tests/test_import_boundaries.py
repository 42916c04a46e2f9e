"""What each side of the process boundary may import (docs/architecture.md, "Modules").

The wire (the shared layout and the protocol) and what runs in a worker never import the engine
of the calling process or the public classes; the engine never imports the public classes. A
spawned worker must be able to load its modules before numpy: it caps the libraries' thread
pools first.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "shmvec"

# Each module of the core, by side; a module may import from its own side and the sides before it.
SIDES = {
    "wire": ["protocol", "probes", "layout", "segment", "barrier", "sync", "tree", "blocks", "errors"],
    "worker": ["worker", "stepper", "worker_threads", "snapshot", "info_columns", "registrations"],
    "engine": [
        "checks", "options", "lifecycle", "start_methods", "processes", "joining", "broadcast", "posting", "completion", "main_block", "replies", "pool",
        "session", "results", "infos", "actions",
        "async_batches", "torch_threads", "rollout_storage", "step_hooks", "cpu_counters",
    ],
    "front": ["vector_env", "async_collection", "rollouts", "states", "diagnose", "slow_loop", "batched_spaces", "make_vec"],
}
ORDER = list(SIDES)
SIDE_OF = {module: side for side, modules in SIDES.items() for module in modules}
# What a spawned worker loads before it caps its threads (its target, shmvec.worker.worker_main, and
# what that imports): the standard library only, at load time.
WORKER_LOADS = ["shmvec.worker", "shmvec.stepper", "shmvec.protocol", "shmvec.worker_threads"]


def shmvec_imports(module: str) -> set[str]:
    """The shmvec modules ``module`` imports anywhere (at load time or inside a function)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shmvec"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from shmvec import protocol as P
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("shmvec."))
    return found


@pytest.mark.parametrize("module", sorted(SIDE_OF))
def test_imports_point_one_way(module):
    side = ORDER.index(SIDE_OF[module])
    later = {m for m in shmvec_imports(module) if m in SIDE_OF and ORDER.index(SIDE_OF[m]) > side}
    assert not later, f"{module} ({SIDE_OF[module]}) imports {sorted(later)}, of a side that uses it"


def test_every_core_module_has_a_side():
    """A new module says which side it is on (the adapters, the GAE kernel and the benchmarks
    are outside the core and may import anything)."""
    outside = {"__init__", "__main__", "_lazy", "_adapters", "advantage", "baselines", "envs", "pettingzoo",
               "ray", "async_rollout", "sb3", "torch"}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - outside
    assert modules == set(SIDE_OF)


def test_a_worker_loads_no_numpy_before_its_thread_caps():
    code = (
        f"import sys\nimport {', '.join(WORKER_LOADS)}\n"
        "loaded = [m for m in ('numpy', 'gymnasium', 'cloudpickle', 'torch') if m in sys.modules]\n"
        "print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
