"""Micro-benchmarks of shmvec.gae against the usual ways of computing GAE.

Run (a few seconds in all)::

    .venv/bin/pytest benchmarks/test_bench_gae.py --benchmark-only -q

At each size ([T, N] float32, bool flags, 1% terminations and 1% truncations):

* ``shmvec_out``: ``shmvec.gae(..., out=(adv, ret))`` into preallocated arrays (what a
  training loop does), serial (the default);
* ``shmvec_alloc``: ``shmvec.gae(...)`` allocating its outputs;
* ``numpy_loop``: CleanRL's reverse loop over time with numpy rows;
* ``python_loop``: a per-env pure-Python loop (the naive implementation);
* ``tianshou_njit``: a Tianshou-style ``@njit`` kernel (delta = rew + v_s_ * gamma - v_s,
  then ``gae = delta[i] + m[i] * gae`` with ``m = (1 - end_flag) * gamma * lam`` over
  flattened env-major arrays), timed on inputs already laid out the way it wants them;
* ``copy_bound``: ``np.copyto`` of as many bytes as the GAE kernel reads plus writes
  (half read, half written): the streaming-bandwidth floor for that traffic.

At the end a table of medians, ns per element and ratios is printed (medians are taken in the
same run, so the ratios are comparable even on a noisy machine). With ``SHMVEC_GAE_JSON=PATH``
the figures docs/gae.md quotes are also written to ``PATH``::

    SHMVEC_GAE_JSON=benchmarks/results-2core/gae.json .venv/bin/pytest benchmarks/test_bench_gae.py --benchmark-only -q
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from numba import njit

from shmvec.advantage import gae
from shmvec.bench.output import write_study

SIZES = [(128, 8), (2048, 64), (128, 4096), (1024, 1024)]
IDS = [f"{T}x{N}" for T, N in SIZES]
GAMMA, LAM = 0.99, 0.95
BUDGET_S = 0.25  # measuring time per benchmark (plus calibration)

_MEDIANS: dict[tuple[str, str], float] = {}


def make_rollout(T: int, N: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, N)).astype(np.float32)
    v = rng.normal(size=(T, N)).astype(np.float32)
    te = rng.random((T, N)) < 0.01
    tr = rng.random((T, N)) < 0.01
    lv = rng.normal(size=N).astype(np.float32)
    return r, v, te, tr, lv


def numpy_loop(rewards, values, next_nonterminal, next_value, gamma, lam):
    """CleanRL's loop (``next_nonterminal[t] = 1 - dones[t + 1]``, float32 like CleanRL)."""
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        nextvalues = next_value if t == T - 1 else values[t + 1]
        nnt = next_nonterminal[t]
        delta = rewards[t] + gamma * nextvalues * nnt - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nnt * lastgaelam
    return advantages, advantages + values


def python_loop(rewards, values, terminated, truncated, last_values, gamma, lam):
    """Per env, a plain Python loop over time."""
    T, N = rewards.shape
    adv = np.empty((T, N), rewards.dtype)
    done = terminated | truncated
    for i in range(N):
        rr = rewards[:, i].tolist()
        vv = values[:, i].tolist()
        dd = done[:, i].tolist()
        col = [0.0] * T
        a = 0.0
        v_next = float(last_values[i])
        for t in range(T - 1, -1, -1):
            nonterminal = 0.0 if dd[t] else 1.0
            a = rr[t] + gamma * v_next * nonterminal - vv[t] + gamma * lam * nonterminal * a
            col[t] = a
            v_next = vv[t]
        adv[:, i] = col
    return adv, adv + values


@njit(cache=True)
def tianshou_gae(v_s, v_s_, rew, end_flag, gamma, gae_lambda):
    """Tianshou-style kernel, from the description in the issue."""
    returns = np.zeros(rew.shape)
    delta = rew + v_s_ * gamma - v_s
    discount = (1.0 - end_flag) * (gamma * gae_lambda)
    g = 0.0
    for i in range(len(rew) - 1, -1, -1):
        g = delta[i] + discount[i] * g
        returns[i] = g
    return returns


def measure(benchmark, key, fn, elements):
    """Calibrated pedantic run: ~BUDGET_S of rounds, each >= ~1 ms of calls."""
    fn()  # compile / load
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    warm_until = time.perf_counter() + min(0.05, 3 * one)  # warm caches and clocks up
    while time.perf_counter() < warm_until:
        fn()
    iterations = max(1, int(1e-3 / one))
    rounds = int(min(60, max(3, BUDGET_S / (one * iterations))))
    if one > 0.5:
        rounds = 1
    benchmark.pedantic(fn, rounds=rounds, iterations=iterations, warmup_rounds=0)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        median = stats.stats.median
        _MEDIANS[key] = median
        benchmark.extra_info["ns_per_element"] = round(median / elements * 1e9, 3)


@pytest.fixture(params=SIZES, ids=IDS)
def case(request, benchmark):
    T, N = request.param
    benchmark.group = f"gae {T}x{N}"
    return (T, N), make_rollout(T, N)


def test_shmvec_out(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    out = (np.empty_like(v), np.empty_like(v))
    measure(benchmark, (f"{T}x{N}", "shmvec_out"),
            lambda: gae(r, v, te, tr, lv, gamma=GAMMA, lam=LAM, out=out), T * N)  # fmt: skip


def test_shmvec_alloc(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    measure(benchmark, (f"{T}x{N}", "shmvec_alloc"),
            lambda: gae(r, v, te, tr, lv, gamma=GAMMA, lam=LAM), T * N)  # fmt: skip


def test_numpy_loop(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    nnt = 1.0 - (te | tr).astype(np.float32)  # CleanRL keeps float32 done flags
    measure(benchmark, (f"{T}x{N}", "numpy_loop"),
            lambda: numpy_loop(r, v, nnt, lv, GAMMA, LAM), T * N)  # fmt: skip
    expected = gae(r, v, te, tr, lv, gamma=GAMMA, lam=LAM)[0]
    np.testing.assert_allclose(numpy_loop(r, v, nnt, lv, GAMMA, LAM)[0], expected,
                               rtol=1e-3, atol=1e-3)  # fmt: skip


def test_python_loop(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    measure(benchmark, (f"{T}x{N}", "python_loop"),
            lambda: python_loop(r, v, te, tr, lv, GAMMA, LAM), T * N)  # fmt: skip


def test_tianshou_njit(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    # env-major flattening (each env's trajectory contiguous), next values precomputed, and
    # an episode boundary at the end of each env's segment: as a Tianshou buffer hands them
    v_s = np.ascontiguousarray(v.T).ravel()
    v_s_ = np.ascontiguousarray(np.vstack([v[1:], lv[None]]).T).ravel()
    rew = np.ascontiguousarray(r.T).ravel()
    end = (te | tr).T.copy()
    end[:, -1] = True
    end_flag = end.ravel().astype(np.float32)
    measure(benchmark, (f"{T}x{N}", "tianshou_njit"),
            lambda: tianshou_gae(v_s, v_s_, rew, end_flag, GAMMA, LAM), T * N)  # fmt: skip


def test_copy_bound(benchmark, case):
    (T, N), (r, v, te, tr, lv) = case
    # bytes per element the kernel moves: reads r, v (4 + 4) and two bool flags (1 + 1),
    # writes advantages and returns (4 + 4): 18, i.e. a copy of 9 bytes per element
    nbytes = T * N * 9
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    measure(benchmark, (f"{T}x{N}", "copy_bound"), lambda: np.copyto(dst, src), T * N)


def paired_ratios(T: int, N: int, batches: int = 15) -> dict[str, float]:
    """Median time per call of each method, from batches interleaved A/B/C/D so that every
    method sees the same machine load (the machine is shared): the ratios quoted in
    docs/gae.md come from here."""
    r, v, te, tr, lv = make_rollout(T, N)
    out = (np.empty_like(v), np.empty_like(v))
    nnt = 1.0 - (te | tr).astype(np.float32)
    v_s = np.ascontiguousarray(v.T).ravel()
    v_s_ = np.ascontiguousarray(np.vstack([v[1:], lv[None]]).T).ravel()
    rew = np.ascontiguousarray(r.T).ravel()
    end_flag = (te | tr).T.ravel().astype(np.float32)
    src = np.ones(T * N * 9, np.uint8)
    dst = np.zeros_like(src)
    fns = {
        "shmvec_out": lambda: gae(r, v, te, tr, lv, gamma=GAMMA, lam=LAM, out=out),
        "shmvec_parallel": lambda: gae(r, v, te, tr, lv, gamma=GAMMA, lam=LAM, out=out,
                                       parallel=True),
        "numpy_loop": lambda: numpy_loop(r, v, nnt, lv, GAMMA, LAM),
        "tianshou_njit": lambda: tianshou_gae(v_s, v_s_, rew, end_flag, GAMMA, LAM),
        "copy_bound": lambda: np.copyto(dst, src),
    }
    reps = {}
    for name, fn in fns.items():
        fn()
        t0 = time.perf_counter()
        fn()
        reps[name] = max(1, int(2e-3 / max(time.perf_counter() - t0, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            n = reps[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    return {name: float(np.median(ts)) for name, ts in times.items()}


@pytest.fixture(scope="module", autouse=True)
def ratio_table(request):
    yield
    if not _MEDIANS:
        return
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            _print_table(print)
    else:
        _print_table(print)


def _print_table(write):
    names = ["shmvec_out", "shmvec_alloc", "numpy_loop", "python_loop", "tianshou_njit",
             "copy_bound"]  # fmt: skip
    write("")
    write("GAE benchmark medians (us) and ns/element; ratios from the same run")
    write(f"{'size':>10} " + " ".join(f"{n:>14}" for n in names))
    for size in IDS:
        T, N = map(int, size.split("x"))
        row = []
        for n in names:
            m = _MEDIANS.get((size, n))
            row.append(f"{m * 1e6:9.1f}/{m / (T * N) * 1e9:4.2f}" if m else f"{'-':>14}")
        write(f"{size:>10} " + " ".join(f"{c:>14}" for c in row))
    write("")
    for size in IDS:
        get = lambda n: _MEDIANS.get((size, n))  # noqa: E731
        ours, alloc = get("shmvec_out"), get("shmvec_alloc")
        parts = []
        for n, label in [("numpy_loop", "x numpy loop"), ("python_loop", "x python loop"),
                         ("tianshou_njit", "x tianshou njit")]:  # fmt: skip
            if ours and get(n):
                parts.append(f"{get(n) / ours:8.1f}{label}")
        if alloc and get("numpy_loop"):
            parts.append(f"alloc {get('numpy_loop') / alloc:.1f}x numpy")
        if ours and get("copy_bound"):
            parts.append(f"out/copy bound {ours / get('copy_bound'):.2f}")
        write(f"{size:>10}: " + ", ".join(parts))
    write("")
    write("Interleaved batches (same load for all), median us per call and ratios:")
    figures = {}
    for size in IDS:
        T, N = map(int, size.split("x"))
        m = paired_ratios(T, N)
        ours = m["shmvec_out"]
        python = _MEDIANS.get((size, "python_loop"))
        figures[size] = {
            "shmvec_us": ours * 1e6,
            "ns_per_element": ours / (T * N) * 1e9,
            "parallel_us": m["shmvec_parallel"] * 1e6,
            "numpy_over_shmvec": m["numpy_loop"] / ours,
            "tianshou_over_shmvec": m["tianshou_njit"] / ours,
            # not interleaved (a second per call at the largest size): the pytest-benchmark medians
            "python_over_shmvec": python / _MEDIANS[(size, "shmvec_out")] if python else None,
            "copy_us": m["copy_bound"] * 1e6,
            "shmvec_over_copy": ours / m["copy_bound"],
        }
        write(
            f"{size:>10}: shmvec {ours * 1e6:.1f} us ({ours / (T * N) * 1e9:.2f} ns/el; parallel=True "
            f"{m['shmvec_parallel'] * 1e6:.1f} us), numpy loop {m['numpy_loop'] / ours:.1f}x "
            f"slower, tianshou njit {m['tianshou_njit'] / ours:.2f}x slower, copy bound "
            f"{m['copy_bound'] * 1e6:.1f} us (shmvec/copy {ours / m['copy_bound']:.2f})"
        )
    if os.environ.get("SHMVEC_GAE_JSON"):
        write_study(os.environ["SHMVEC_GAE_JSON"], figures)
