"""Where the calling process's instructions go in one round, function by function of the round's
path: callgrind's inclusive counts, per round.

    .venv/bin/python benchmarks/round_phases.py --json benchmarks/results-2core/round_phases.json --write-docs

(``make bench-round-phases``; needs valgrind and a C compiler.) The rounds are
``round_instructions_ab``'s: ``step`` of 16 do-nothing envs on 2 workers, ``send/recv`` of one
block, and ``send/sleep/recv`` (the block done when ``recv`` looks), waits that block at once,
every process on one CPU.

Callgrind sees the interpreter's C functions, not Python's. So, in the measured process only,
each function of :data:`PHASES` is replaced by an object that calls it through a C function of
its own (``shmvec_phase_<k>``, compiled here against this Python's headers), whose inclusive
count is then the Python function's, everything it calls included. Each figure is the
difference of two runs of different lengths (start-up cancelled out), per round, beside the
calls per round. A wrapped call costs the functions around it a few dozen instructions more
(``wrapper_cost_per_call``, measured in the same run by :func:`calibrate`); ``total_unwrapped``
is the caller's whole count per round in a run without them, which the top row comes close to
(the wrapped process is a little slower, so it may find the workers done a little more often).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (round_instructions_ab, caller_cost beside it)

import round_instructions_ab as rounds  # noqa: E402
from caller_cost import callers_count  # noqa: E402

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
DOCS = ROOT / "docs/benchmarks.md"
MARKERS = ("<!-- round-phases:begin -->\n", "\n<!-- round-phases:end -->")

# The round's path in each kind of round, as (function, depth in its table): a function is
# called from the nearest one above it at a smaller depth. A function with no call in a round is
# left out of its table.
STEP = [
    ("shmvec.vector_env.ShmVecEnv.step", 0),
    ("shmvec.session.Session.step", 1),
    ("shmvec.slow_loop.SlowLoopWatch.enter", 2),
    ("shmvec.torch_threads.TorchThreads.enter", 2),
    ("shmvec.actions.ActionBatch.write", 2),
    ("shmvec.actions.ActionBatch._checked", 3),
    ("shmvec.pool.WorkerPool.broadcast", 2),
    ("shmvec.broadcast.BroadcastRound.run", 3),
    ("shmvec.completion.Completion.wait_out_counted", 3),
    ("shmvec.pool.WorkerPool._collect", 3),
    ("shmvec.session.Session._after", 2),
    ("shmvec.infos.InfoMerger.merge", 3),
    ("shmvec.slow_loop.SlowLoopWatch.leave", 2),
    ("shmvec.torch_threads.TorchThreads.leave", 2),
    ("shmvec.results.Results.step", 1),
]
SEND_RECV = [
    ("shmvec.async_collection.AsyncCollection.send", 0),
    ("shmvec.session.Session.guard", 1),
    ("shmvec.async_batches.Batches.covering", 1),
    ("shmvec.session.Session.write_actions", 1),
    ("shmvec.actions.ActionBatch.write", 2),
    ("shmvec.session.Session.submit", 1),
    ("shmvec.session.Session.to_home", 2),
    ("shmvec.pool.WorkerPool.submit", 2),
    ("shmvec.posting.Posting.post", 3),
    ("shmvec.async_collection.AsyncCollection.recv", 0),
    ("shmvec.session.Session.guard", 1),
    ("shmvec.session.Session.recv", 1),
    ("shmvec.slow_loop.SlowLoopWatch.enter", 2),
    ("shmvec.torch_threads.TorchThreads.enter", 2),
    ("shmvec.pool.WorkerPool.receive", 2),
    ("shmvec.pool.WorkerPool.wait", 3),
    ("shmvec.completion.Completion.wait", 4),
    ("shmvec.completion.spin_until", 5),
    ("shmvec.completion.block_until", 5),
    ("shmvec.sync.readable", 6),
    ("shmvec.replies.Replies.collect", 3),
    ("shmvec.async_batches.Batches.of", 2),
    ("shmvec.session.Session._after", 2),
    ("shmvec.infos.InfoMerger.merge", 3),
    ("shmvec.results.Results.batch", 2),
    ("shmvec.slow_loop.SlowLoopWatch.leave", 2),
    ("shmvec.torch_threads.TorchThreads.leave", 2),
]
TABLES = {"step": STEP, "send/recv": SEND_RECV, "send/sleep/recv": SEND_RECV}
# Every function wrapped, each once: C function k is PHASES[k]'s.
PHASES = list(dict.fromkeys(path for table in TABLES.values() for path, _ in table))

# A callable type whose calls go through a C function of each phase's own, ``shmvec_phase_<k>``:
# it counts them and calls the function it wraps with the same arguments (vectorcall, and as a
# method descriptor: a method wrapped is called without a bound method being built).
C_SOURCE = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;
    long long calls;
} Phase;

static void phase_dealloc(Phase *self) { Py_XDECREF(self->fn); Py_TYPE(self)->tp_free((PyObject *)self); }

static PyObject *phase_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyTypeObject PhaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "phase_trampolines.Phase",
    .tp_basicsize = sizeof(Phase),
    .tp_dealloc = (destructor)phase_dealloc,
    .tp_vectorcall_offset = offsetof(Phase, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = phase_get,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
};

#define PHASE(k) PyObject *shmvec_phase_##k(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kw) \\
    { ((Phase *)self)->calls++; return PyObject_Vectorcall(((Phase *)self)->fn, args, nargsf, kw); }
%(defs)s
static vectorcallfunc table[] = {%(table)s};

static PyObject *wrap(PyObject *module, PyObject *args) {
    int k; PyObject *fn;
    if (!PyArg_ParseTuple(args, "iO", &k, &fn)) return NULL;
    if (k < 0 || k >= (int)(sizeof(table) / sizeof(table[0]))) {
        PyErr_SetString(PyExc_IndexError, "phase");
        return NULL;
    }
    Phase *p = PyObject_New(Phase, &PhaseType);
    if (p == NULL) return NULL;
    p->vectorcall = table[k]; Py_INCREF(fn); p->fn = fn; p->calls = 0;
    return (PyObject *)p;
}

static PyObject *calls(PyObject *module, PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &PhaseType)) { PyErr_SetString(PyExc_TypeError, "not a Phase"); return NULL; }
    return PyLong_FromLongLong(((Phase *)obj)->calls);
}

static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, NULL},
    {"calls", calls, METH_O, NULL},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "phase_trampolines", NULL, -1, methods};
PyMODINIT_FUNC PyInit_phase_trampolines(void) {
    if (PyType_Ready(&PhaseType) < 0) return NULL;
    return PyModule_Create(&module);
}
"""


def build_trampolines(folder: Path, count: int):
    """Compile and import the module of :data:`C_SOURCE` with ``count`` C functions:
    ``wrap(k, fn)`` returns ``fn`` called through C function ``k``, ``calls(wrapped)`` its
    calls (no sibling-call optimisation: each C function stays on the stack while ``fn`` runs).
    """
    defs = " ".join(f"PHASE({k})" for k in range(count))
    table = ", ".join(f"shmvec_phase_{k}" for k in range(count))
    src = folder / "phase_trampolines.c"
    src.write_text(C_SOURCE % {"defs": defs, "table": table})
    so = folder / ("phase_trampolines" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    cmd = ["cc", "-shared", "-fPIC", "-O1", "-fno-optimize-sibling-calls", f"-I{include}", str(src), "-o", str(so)]
    subprocess.run(cmd, check=True)
    spec = importlib.util.spec_from_file_location("phase_trampolines", so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrap(trampolines) -> list:
    """Replace each function of :data:`PHASES` by itself called through its C function; the
    wrapped callables, in :data:`PHASES`' order."""
    wrapped = []
    for k, path in enumerate(PHASES):
        module_name, _, rest = path.rpartition(".")
        try:
            owner = importlib.import_module(module_name)
        except ImportError:  # a method: module.Class.method
            module_name, _, owner_name = module_name.rpartition(".")
            owner = getattr(importlib.import_module(module_name), owner_name)
        wrapped.append(trampolines.wrap(k, getattr(owner, rest)))
        setattr(owner, rest, wrapped[-1])
    return wrapped


def child(kind: str, count: int, folder: str, with_phases: bool) -> None:
    """Under callgrind: :func:`round_instructions_ab.child`'s rounds, :data:`PHASES` wrapped if
    ``with_phases``; the calls per function to ``folder``/calls.json."""
    wrapped = []
    if with_phases:
        trampolines = build_trampolines(Path(folder), len(PHASES) + 3)
        wrapped = wrap(trampolines)
    rounds.child(kind, count, str(Path(folder) / "sleeps"))
    if with_phases:
        calibrate(trampolines)
    calls = [trampolines.calls(w) for w in wrapped] if with_phases else []
    Path(folder, "calls.json").write_text(json.dumps(calls))


def nothing(*args, **kwargs):
    """What the calibration calls."""


def calibrate(trampolines) -> None:
    """What a wrapped call costs the phases around it: :data:`CALIBRATION` calls of
    :func:`nothing` through C function ``len(PHASES) + 2``, inside C function ``len(PHASES)``,
    against as many plain calls inside ``len(PHASES) + 1``."""
    k = len(PHASES)
    wrapped = trampolines.wrap(k + 2, nothing)

    def calls(fn) -> None:
        for _ in range(CALIBRATION):
            fn(1, key=2)

    trampolines.wrap(k, calls)(wrapped)
    trampolines.wrap(k + 1, calls)(nothing)


CALIBRATION = 1000


def inclusive_counts(path: Path) -> dict[int, int]:
    """Each ``shmvec_phase_<k>``'s inclusive instructions in a callgrind output file: its own
    cost lines and those of its calls (callgrind measures a call's cost from its entry to its
    return, so nesting and recursion through the interpreter need no rebuilding here)."""
    names: dict[str, str] = {}
    totals: dict[int, int] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("fn="):
            ref = line[3:]
            if ref.startswith("("):
                key, _, name = ref.partition(") ")
                key += ")"
                if name:
                    names[key] = name
                ref = names.get(key, key)
            found = re.fullmatch(r"shmvec_phase_(\d+)", ref.split("'")[0])
            current = int(found.group(1)) if found else None
        elif line.startswith(("cfn=", "cfi=", "cob=", "calls=", "fl=", "fi=", "fe=", "ob=")):
            for prefix in ("cfn=", "fn="):  # (names first given in a call's line)
                if line.startswith(prefix) and "(" in line and ") " in line:
                    key, _, name = line[len(prefix) :].partition(") ")
                    names[key + ")"] = name
        elif current is not None and line and (line[0].isdigit() or line[0] in "+-*"):
            totals[current] = totals.get(current, 0) + int(line.split()[-1])
    return totals


def measure(kind: str, count: int) -> tuple[dict[int, int], list[int], int]:
    """One run of ``count`` rounds: each wrapped function's inclusive instructions (by index),
    its calls, and the caller's total count unwrapped."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cg.%p"
        cmd = ["valgrind", "--tool=callgrind", "--compress-strings=no", "--compress-pos=no"]
        cmd += [f"--callgrind-out-file={out}", sys.executable, str(HERE), "--child", kind, str(count), folder]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"callgrind run failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
        caller = re.search(r"==(\d+)==", run.stderr).group(1)
        inclusive = inclusive_counts(Path(folder) / f"cg.{caller}")
        calls = json.loads(Path(folder, "calls.json").read_text())
    unwrapped = callers_count([sys.executable, str(HERE), "--child", kind, str(count), "-", "--unwrapped"], env)
    return inclusive, calls, unwrapped


def phases_of(kind: str, rounds_: int) -> dict:
    """Per round of ``kind``: each function's calls and instructions, and the totals."""
    (long, long_calls, long_total), (short, short_calls, short_total) = measure(kind, 1 + rounds_), measure(kind, 1)
    rows = []
    for path, depth in TABLES[kind]:
        k = PHASES.index(path)
        calls = (long_calls[k] - short_calls[k]) / rounds_
        if calls == 0:
            continue
        instructions = (long.get(k, 0) - short.get(k, 0)) / rounds_
        rows.append(
            {"function": path.removeprefix("shmvec."), "depth": depth, "calls": calls, "instructions": instructions}
        )
    k = len(PHASES)
    return {
        "rows": rows,
        "total_unwrapped": (long_total - short_total) / rounds_,
        "wrapper_cost_per_call": (long[k] - long[k + 1]) / CALIBRATION,
    }


def format_table(result: dict) -> str:
    """The Markdown tables docs/benchmarks.md shows, one per kind of round."""
    parts = []
    for kind, cell in result["cells"].items():
        lines = [
            f"`{kind}`: {cell['total_unwrapped']:,.0f} instructions per round unwrapped; each wrapped call adds "
            f"about {cell['wrapper_cost_per_call']:,.0f}.",
            "",
            "| function (nested: called from the one above) | calls per round | instructions per round |",
            "|---|---:|---:|",
        ]
        for row in cell["rows"]:
            indent = "&nbsp;&nbsp;" * row["depth"]
            lines.append(f"| {indent}`{row['function']}` | {row['calls']:g} | {row['instructions']:,.0f} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(rounds.KINDS), help=f"comma-separated, from {list(rounds.KINDS)}")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the one CPU of every process")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--write-docs", action="store_true", help="put the tables into docs/benchmarks.md")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--unwrapped", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, count, folder = args.child
        if args.unwrapped:
            with tempfile.TemporaryDirectory() as scratch:
                rounds.child(kind, int(count), str(Path(scratch) / "sleeps"))
        else:
            child(kind, int(count), folder, with_phases=True)
        return {}
    os.sched_setaffinity(0, {args.cpu})  # (inherited by valgrind, the caller and its workers)
    cells = {}
    for kind in args.kinds.split(","):
        runs = [phases_of(kind, args.rounds) for _ in range(args.repeats)]
        cell = runs[0] if len(runs) == 1 else _median_of(runs)
        cells[kind] = cell
    result = {"rounds": args.rounds, "repeats": args.repeats, "workers": 2, "cells": cells}
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.write_docs:
        text = DOCS.read_text()
        begin, end = (marker.strip("\n") for marker in MARKERS)
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        DOCS.write_text(head + MARKERS[0] + format_table(result) + MARKERS[1] + tail)
    return result


def _median_of(runs: list[dict]) -> dict:
    """Each figure's median over ``runs`` of one kind (the same rows in each)."""
    out = json.loads(json.dumps(runs[0]))
    for i, row in enumerate(out["rows"]):
        for key in ("calls", "instructions"):
            row[key] = statistics.median(r["rows"][i][key] for r in runs)
    for key in ("total_unwrapped", "wrapper_cost_per_call"):
        out[key] = statistics.median(r[key] for r in runs)
    return out


if __name__ == "__main__":
    main()
