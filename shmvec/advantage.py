"""Generalized Advantage Estimation (GAE) that gets truncation right, as one Numba kernel.

Layout and conventions
----------------------
All per-step arrays are time-major ``[T, N]`` (``T`` steps of ``N`` envs), as a rollout
buffer fills them: row ``t`` holds what the agent saw and got at step ``t``.

* ``values[t]`` is ``V(s_t)``, the value of the observation on which action ``t`` was taken.
* ``rewards[t]``, ``terminated[t]`` and ``truncated[t]`` are what ``env.step`` returned for
  action ``t``.
* ``last_values`` (``[N]``) is ``V(s_T)``, the value of the observation returned by the
  last step of the rollout (the one the next rollout starts from).
* ``final_values`` (optional, ``[T, N]``): where ``truncated[t]``, the value of that
  episode's final observation (``infos["final_obs"]`` under SAME_STEP autoreset). Elsewhere
  it is never read, so it may hold anything there (zeros, NaN).

For each step, with ``V(next_t) = values[t + 1]`` (``last_values`` at ``t = T - 1``)::

    bootstrap_t = 0                 if terminated[t]
                = final_values[t]   elif truncated[t] (see below when it is not given)
                = V(next_t)         otherwise
    delta_t     = rewards[t] + gamma * bootstrap_t - values[t]
    A_t         = delta_t + gamma * lam * (1 - (terminated[t] or truncated[t])) * A_{t+1}
    returns_t   = A_t + values[t]

with ``A_T = 0``. Without ``final_values`` a truncated step bootstraps nothing, exactly like
a terminated one (the CleanRL convention); with ``autoreset="next_step"`` it bootstraps from
``V(next_t)``, which under NEXT_STEP autoreset *is* the value of the final observation.

``valid`` (optional ``[T, N]`` bool) marks real transitions. Where it is False the step is
not a transition at all (under NEXT_STEP: the reset step that follows an episode end, whose
action is ignored): its advantage is 0 (so its return is ``values[t]``), its reward and flags
are ignored, and nothing propagates through it (``A_{t+1}`` seen by step ``t`` is 0). The
step before it bootstraps as its own flags say.

``discounted_returns`` computes the lambda-returns ``G_t = A_t + values[t]`` directly (one
output, no advantages): with ``lam=1`` they are the discounted sums of rewards,
bootstrapped at episode ends and at the end of the rollout as above.

The kernel is one reverse pass over time with the envs in the inner loop (row-major, so
every access is contiguous and the loop vectorizes), no temporaries (the carry ``A_{t+1}`` is
read back from the output row just written); it is compiled with ``@njit(cache=True)``.
``parallel=True`` runs the same loop on blocks of envs, one per Numba thread; it is never
chosen for you (threads pay only for large rollouts on idle cores). See ``docs/gae.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from numba import get_num_threads, njit, prange

from shmvec.checks import parse_autoreset_mode

__all__ = ["gae", "discounted_returns", "rollout_gae"]

# Parallel blocks start on multiples of this many envs (64 bytes of float32) so that two
# threads never write into the same cache line.
_BLOCK_ALIGN = 16

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_FLOATS = (_F32, _F64)
_BOOL = np.dtype(np.bool_)
_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)  # how a rollout may have been collected
# The default of ``autoreset``: the fast path recognises it (or the member) by identity, any other
# spelling goes through parse_autoreset_mode.
_SAME_STEP_NAME = "same_step"


# --------------------------------------------------------------------------------------
# Numba kernels
# --------------------------------------------------------------------------------------


@njit
def _step(rew, val, nxt, fin, term, trunc, ok, carry, g, gl, zero, use_final, trunc_next, ret_only):
    """One (t, env) update; returns the new carry (A_t, or G_t when ``ret_only``).

    Everything is branch-free (selects), so the env loop vectorizes; the flags
    ``use_final``/``trunc_next``/``ret_only`` are loop-invariant.
    """
    if use_final:
        tb = fin
    elif trunc_next:
        tb = nxt
    else:
        tb = zero
    boot = zero if term else (tb if trunc else nxt)
    done = term | trunc
    if ret_only:
        # lambda-return: G_t = r_t + gamma * (boot if done else (1 - lam) V(next) + lam G_{t+1}),
        # with g = gamma and gl = gamma * lam; an invalid step has G_t = V(s_t).
        cont = (g - gl) * nxt + gl * carry
        out = rew + (g * boot if done else cont)
        return out if ok else val
    a = rew - val + g * boot + (zero if done else gl * carry)
    return a if ok else zero


@njit(inline="always")
def _block(rew, val, term, trunc, last, fin, vld, adv, ret, lo, hi,
           g, gl, zero, use_final, trunc_next, has_valid, ret_only, opaque):  # fmt: skip
    """All time steps, in reverse, for envs ``lo..hi`` (uint64: no wraparound checks).

    The env loop is the inner loop: contiguous rows, vectorized by LLVM. The carry A_{t+1}
    (G_{t+1} for lambda-returns) is read back from the row just written.
    """
    T = rew.shape[0]
    if T == 0:
        return
    # With ``opaque``, the row index is OR-ed with a zero LLVM cannot see through (x != x is
    # False for any non-NaN x, but LLVM may not assume that). Otherwise LLVM hoists the env
    # loop's aliasing checks out of the time loop, and since that loop walks memory
    # backwards the hoisted checks always fail: the scalar fallback would run instead of the
    # vector loop. The price is a few multiplications per row, worth paying only when the
    # rows are long enough for the vector loop (_VECTOR_MIN_N envs).
    z = np.int64(zero != zero) if opaque else 0
    t = (T - 1) | z
    for i in range(lo, hi):
        v = val[t, i]
        ok = (vld[t, i] != 0) | (not has_valid)
        c0 = last[i] if ret_only else zero  # G_T = V(s_T); A_T = 0
        c = _step(rew[t, i], v, last[i], fin[t, i], term[t, i] != 0, trunc[t, i] != 0, ok,
                  c0, g, gl, zero, use_final, trunc_next, ret_only)  # fmt: skip
        if ret_only:
            ret[t, i] = c
        else:
            adv[t, i] = c
            ret[t, i] = c + v
    for s in range(1, T):
        t = (T - 1 - s) | z
        for i in range(lo, hi):
            v = val[t, i]
            ok = (vld[t, i] != 0) | (not has_valid)
            c1 = ret[t + 1, i] if ret_only else adv[t + 1, i]
            c = _step(rew[t, i], v, val[t + 1, i], fin[t, i], term[t, i] != 0,
                      trunc[t, i] != 0, ok, c1, g, gl, zero, use_final, trunc_next,
                      ret_only)  # fmt: skip
            if ret_only:
                ret[t, i] = c
            else:
                adv[t, i] = c
                ret[t, i] = c + v


@njit
def _consts(like, gamma, lam):
    # gamma and gamma * lam in the dtype of the outputs, so float32 data is computed in
    # float32 (twice the SIMD width) and float64 in float64.
    k = np.empty(2, like.dtype)
    k[0] = gamma
    k[1] = gamma * lam
    return k[0], k[1], k[0] - k[0]


@njit
def _span(a):
    """Byte range [lo, hi) that array ``a`` spans (any strides); empty for an empty array."""
    lo = a.ctypes.data
    if a.size == 0:
        return lo, lo
    hi = lo + a.itemsize
    for d in range(a.ndim):
        ext = (a.shape[d] - 1) * a.strides[d]
        if ext < 0:
            lo += ext
        else:
            hi += ext
    return lo, hi


@njit
def _hits(a, lo, hi):
    alo, ahi = _span(a)
    return alo < hi and lo < ahi


@njit
def _overlap(rew, val, term, trunc, last, fin, vld, adv, ret, ret_only):
    """1 if an output shares memory with an input, 2 if the two outputs overlap, else 0.

    A bounds test like numpy.may_share_memory, without a Python call per pair.
    """
    rlo, rhi = _span(ret)
    alo, ahi = _span(adv)
    if not ret_only and alo < rhi and rlo < ahi:
        return 2
    for k in range(1 if ret_only else 2):
        lo = rlo if k == 0 else alo
        hi = rhi if k == 0 else ahi
        if _hits(rew, lo, hi) or _hits(val, lo, hi) or _hits(term, lo, hi) or \
                _hits(trunc, lo, hi) or _hits(last, lo, hi) or _hits(fin, lo, hi) or \
                _hits(vld, lo, hi):  # fmt: skip
            return 1
    return 0


# Rows shorter than this never take LLVM's vector loop (16 float32 per iteration at AVX2
# width with an unroll of 2), so they use the plain row index (see _block).
_VECTOR_MIN_N = 16

# Bits of the ``mode`` argument of the kernels.
_USE_FINAL, _TRUNC_NEXT, _HAS_VALID, _RET_ONLY, _CHECK_OUT = 1, 2, 4, 8, 16


@njit(cache=True)
def _kernel(rew, val, term, trunc, last, fin, vld, adv, ret, gamma, lam, mode):
    """The serial kernel: options as ``mode`` bits; returns 0, or an _overlap code.

    The common call (no option but _CHECK_OUT) runs a copy of the loop with constant flags:
    leaner and faster than the one with runtime flags (``benchmarks/test_bench_gae.py``).
    """
    if mode & _CHECK_OUT:
        bad = _overlap(rew, val, term, trunc, last, fin, vld, adv, ret, (mode & _RET_ONLY) != 0)
        if bad:
            return bad
    g, gl, zero = _consts(ret, gamma, lam)
    N = rew.shape[1]
    lo, hi = np.uint64(0), np.uint64(N)
    if mode & ~_CHECK_OUT:
        _block(rew, val, term, trunc, last, fin, vld, adv, ret, lo, hi, g, gl, zero,
               (mode & _USE_FINAL) != 0, (mode & _TRUNC_NEXT) != 0, (mode & _HAS_VALID) != 0,
               (mode & _RET_ONLY) != 0, True)  # fmt: skip
    elif N >= _VECTOR_MIN_N:
        _block(rew, val, term, trunc, last, fin, vld, adv, ret, lo, hi, g, gl, zero,
               False, False, False, False, True)  # fmt: skip
    else:
        _block(rew, val, term, trunc, last, fin, vld, adv, ret, lo, hi, g, gl, zero,
               False, False, False, False, False)  # fmt: skip
    return 0


@njit(cache=True, parallel=True)
def _kernel_parallel(rew, val, term, trunc, last, fin, vld, adv, ret, gamma, lam, mode,
                     nblocks):  # fmt: skip
    if mode & _CHECK_OUT:
        bad = _overlap(rew, val, term, trunc, last, fin, vld, adv, ret, (mode & _RET_ONLY) != 0)
        if bad:
            return bad
    N = rew.shape[1]
    g, gl, zero = _consts(ret, gamma, lam)
    use_final = (mode & _USE_FINAL) != 0
    trunc_next = (mode & _TRUNC_NEXT) != 0
    has_valid = (mode & _HAS_VALID) != 0
    ret_only = (mode & _RET_ONLY) != 0
    for b in prange(nblocks):
        lo = (N * b // nblocks) // _BLOCK_ALIGN * _BLOCK_ALIGN
        hi = N if b == nblocks - 1 else (N * (b + 1) // nblocks) // _BLOCK_ALIGN * _BLOCK_ALIGN
        _block(rew, val, term, trunc, last, fin, vld, adv, ret, np.uint64(lo), np.uint64(hi),
               g, gl, zero, use_final, trunc_next, has_valid, ret_only, True)  # fmt: skip
    return 0


# --------------------------------------------------------------------------------------
# Python front end: validation kept cheap (a few microseconds at small sizes)
# --------------------------------------------------------------------------------------


def _describe(a: np.ndarray) -> str:
    return f"shape {a.shape} dtype {a.dtype}"


def _asarray(x: Any, name: str) -> np.ndarray:
    if type(x) is np.ndarray:
        return x
    try:
        return np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name}: expected an array-like, got {type(x).__name__}") from exc


def _real(x: Any, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A real array of ``shape``, converted to ``dtype`` (a temporary) if it has another one."""
    a = _asarray(x, name)
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got shape {a.shape}")
    if a.dtype != dtype:
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{name}: expected a real (float or integer) dtype, got {a.dtype}")
        a = a.astype(dtype)
    return a


def _flags(x: Any, name: str, shape: tuple) -> np.ndarray:
    """A flag array of ``shape``: bool is read in place, other numeric dtypes become ``x != 0``."""
    a = _asarray(x, name)
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got shape {a.shape}")
    if a.dtype != _BOOL:
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{name}: expected a bool or numeric dtype, got {a.dtype}")
        a = a != 0
    return a


def _output(o: Any, name: str, v: np.ndarray) -> np.ndarray:
    if type(o) is not np.ndarray:
        raise ValueError(f"{name}: expected a numpy.ndarray, got {type(o).__name__}")
    if o.shape != v.shape or o.dtype != v.dtype:
        raise ValueError(f"{name}: expected shape {v.shape} dtype {v.dtype} (like values), got {_describe(o)}")
    if not o.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array, got a read-only one")
    return o


def _prepare(rewards, values, terminated, truncated, last_values, final_values, valid,
             autoreset):  # fmt: skip
    """Validated inputs, as the kernels take them, and the mode bits.

    The checks on the common path (ndarrays of the right shape and dtype) are identity tests
    and a few attribute reads; anything else goes through the slower converting helpers.
    """
    v = values
    if type(v) is not np.ndarray:
        v = _asarray(v, "values")
    dtype = v.dtype
    if v.ndim != 2 or (dtype is not _F32 and dtype is not _F64 and dtype not in _FLOATS):
        raise ValueError(f"values: expected a [T, N] float32 or float64 array, got {_describe(v)}")
    shape = v.shape

    r = rewards
    if type(r) is not np.ndarray or r.dtype is not dtype or r.shape != shape:
        r = _real(r, "rewards", shape, dtype)
    te = terminated
    if type(te) is not np.ndarray or te.dtype is not _BOOL or te.shape != shape:
        te = _flags(te, "terminated", shape)
    tr = truncated
    if type(tr) is not np.ndarray or tr.dtype is not _BOOL or tr.shape != shape:
        tr = _flags(tr, "truncated", shape)
    lv = last_values
    if type(lv) is not np.ndarray or lv.dtype is not dtype or lv.shape != shape[1:]:
        lv = _real(lv, "last_values", shape[1:], dtype)

    mode = 0
    if final_values is None:
        fv = v  # a stand-in of the right type, never read
    else:
        fv = final_values
        if type(fv) is not np.ndarray or fv.dtype is not dtype or fv.shape != shape:
            fv = _real(fv, "final_values", shape, dtype)
        mode = _USE_FINAL
    if parse_autoreset_mode(autoreset, "autoreset", _MODES) is AutoresetMode.NEXT_STEP:
        mode |= _TRUNC_NEXT
    if valid is None:
        if mode & _TRUNC_NEXT:
            raise ValueError(
                "valid: required with autoreset='next_step': a [T, N] bool array, False on "
                "the reset steps that follow an episode end (see docs/gae.md)"
            )
        vd = te  # never read
    else:
        vd = valid
        if type(vd) is not np.ndarray or vd.dtype is not _BOOL or vd.shape != shape:
            vd = _flags(vd, "valid", shape)
        mode |= _HAS_VALID
    return r, v, te, tr, lv, fv, vd, mode


def _compute(r, v, te, tr, lv, fv, vd, adv, ret, gamma, lam, mode, parallel):
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: expected a number in [0, 1], got {gamma!r}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam: expected a number in [0, 1], got {lam!r}")
    T, N = v.shape
    if T == 0 or N == 0:
        return
    g, lm = float(gamma), float(lam)
    # A block per thread, each at least _BLOCK_ALIGN envs wide; one block runs serially.
    nblocks = min(get_num_threads(), N // _BLOCK_ALIGN) if parallel else 1
    if nblocks > 1:
        bad = _kernel_parallel(r, v, te, tr, lv, fv, vd, adv, ret, g, lm, mode, nblocks)
    else:
        bad = _kernel(r, v, te, tr, lv, fv, vd, adv, ret, g, lm, mode)
    if bad:
        _raise_overlap(bad)


def _raise_overlap(code: int) -> None:
    if code == 2:
        raise ValueError("out: the advantages and returns arrays must not share memory")
    raise ValueError("out: the output arrays must not share memory with the inputs")


def gae(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    last_values: Any,
    final_values: Any | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    valid: Any | None = None,
    autoreset: Any = _SAME_STEP_NAME,
    parallel: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized Advantage Estimation over a ``[T, N]`` rollout, truncation-aware.

    Parameters
    ----------
    rewards : array_like, shape [T, N]
        ``rewards[t]`` returned by step ``t``. Converted to the dtype of ``values`` if it has
        another real dtype (a temporary copy).
    values : array_like, shape [T, N], float32 or float64
        ``values[t] = V(s_t)``, the value of the observation on which action ``t`` was taken.
        The outputs have this dtype.
    terminated, truncated : array_like, shape [T, N], bool or numeric
        The flags returned by step ``t``. Bool arrays are read in place; numeric ones are
        converted with ``!= 0`` (a temporary).
    last_values : array_like, shape [N]
        ``V(s_T)``, the value of the observation returned by the last step.
    final_values : array_like, shape [T, N], optional
        Where ``truncated[t]`` (and not ``terminated[t]``), the value of that episode's final
        observation, used as the bootstrap; ignored elsewhere (may hold anything there).
        **Without it a truncated step bootstraps nothing**, exactly like a terminated one
        (CleanRL's convention), unless ``autoreset="next_step"``.
    gamma : float, default 0.99
        Discount, in [0, 1].
    lam : float, default 0.95
        GAE lambda, in [0, 1] (0: one-step TD errors, 1: Monte-Carlo advantages).
    out : tuple of two ndarrays, optional
        ``(advantages, returns)`` to write into (shape [T, N], dtype of ``values``, any
        strides, not sharing memory with the inputs or each other); with bool flags and
        matching dtypes nothing is allocated.
    valid : array_like, shape [T, N], bool, optional
        False where step ``t`` is not a real transition (under NEXT_STEP autoreset: the reset
        step after an episode end). There the advantage is 0 (the return is ``values[t]``),
        the step's reward and flags are ignored, and nothing propagates through it. Required
        with ``autoreset="next_step"``.
    autoreset : {"same_step", "next_step"} or gymnasium.vector.AutoresetMode
        How the rollout was collected. ``"next_step"``: a truncated step bootstraps from
        ``values[t + 1]`` (``last_values`` at ``t = T - 1``), which under NEXT_STEP is the
        value of the final observation, unless ``final_values`` is given.
    parallel : bool, default False
        True: split the envs into blocks run by ``numba.get_num_threads()`` threads (numba
        ``prange``); worth it from about 1024 envs when the cores are idle. False (or None):
        one thread. Nothing is chosen automatically. Results are bit-identical either way.

    Returns
    -------
    advantages, returns : ndarray, shape [T, N]
        ``returns = advantages + values``. The ``out`` arrays when given.

    Raises
    ------
    ValueError
        On a bad shape or dtype (the message names the argument, what was expected and what
        it got), on ``gamma``/``lam`` outside [0, 1], or on outputs that overlap the inputs.

    Notes
    -----
    ``delta_t = r_t + gamma * bootstrap_t - V(s_t)`` with ``bootstrap_t`` = 0 if terminated,
    the final observation's value if truncated, ``V(s_{t+1})`` otherwise;
    ``A_t = delta_t + gamma * lam * (1 - (terminated_t or truncated_t)) * A_{t+1}``.
    See ``docs/gae.md`` for both autoreset modes in a PPO loop.

    Examples
    --------
    >>> import numpy as np, shmvec
    >>> r = np.ones((3, 1), np.float32); v = np.zeros((3, 1), np.float32)
    >>> done = np.array([[False], [True], [False]])
    >>> adv, ret = shmvec.gae(r, v, done, np.zeros_like(done), np.zeros(1, np.float32),
    ...                       gamma=0.5, lam=1.0)
    >>> adv[:, 0].tolist()
    [1.5, 1.0, 1.0]
    """
    # Fast path for the common call (ndarrays of matching dtypes and shapes, no options, one
    # thread): identity tests and a few attribute reads.
    v = values
    if (final_values is None and valid is None and not parallel
            and (autoreset is _SAME_STEP_NAME or autoreset is AutoresetMode.SAME_STEP) and type(v) is np.ndarray
            and type(rewards) is np.ndarray and type(terminated) is np.ndarray
            and type(truncated) is np.ndarray and type(last_values) is np.ndarray):  # fmt: skip
        dtype = v.dtype
        shape = v.shape
        if ((dtype is _F32 or dtype is _F64) and rewards.dtype is dtype
                and terminated.dtype is _BOOL and truncated.dtype is _BOOL
                and last_values.dtype is dtype and len(shape) == 2 and rewards.shape == shape
                and terminated.shape == shape and truncated.shape == shape
                and last_values.shape == shape[1:] and shape[0] * shape[1] > 0
                and 0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):  # fmt: skip
            if out is None:
                adv = np.empty(shape, dtype)
                ret = np.empty(shape, dtype)
                _kernel(rewards, v, terminated, truncated, last_values, v, terminated, adv, ret,
                        float(gamma), float(lam), 0)  # fmt: skip
                return adv, ret
            if type(out) is tuple and len(out) == 2:
                adv, ret = out
                if (type(adv) is np.ndarray and type(ret) is np.ndarray and adv.dtype is dtype
                        and ret.dtype is dtype and adv.shape == shape and ret.shape == shape
                        and adv.flags.writeable and ret.flags.writeable):  # fmt: skip
                    bad = _kernel(rewards, v, terminated, truncated, last_values, v, terminated,
                                  adv, ret, float(gamma), float(lam), _CHECK_OUT)  # fmt: skip
                    if bad:
                        _raise_overlap(bad)
                    return adv, ret

    r, v, te, tr, lv, fv, vd, mode = _prepare(
        rewards, values, terminated, truncated, last_values, final_values, valid, autoreset
    )
    if out is None:
        adv = np.empty(v.shape, v.dtype)
        ret = np.empty(v.shape, v.dtype)
    else:
        try:
            adv, ret = out
        except (TypeError, ValueError):
            raise ValueError(f"out: expected a pair (advantages, returns), got {type(out).__name__}") from None
        adv = _output(adv, "out[0] (advantages)", v)
        ret = _output(ret, "out[1] (returns)", v)
        mode |= _CHECK_OUT
    _compute(r, v, te, tr, lv, fv, vd, adv, ret, gamma, lam, mode, parallel)
    return adv, ret


def rollout_gae(
    batch: dict[str, Any],
    last_values: Any,
    *,
    values: str | Any = "value",
    final_values: Any | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
    parallel: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gae` over a batch of ``ShmVecEnv.rollout`` (or ``MultiAgentVecEnv.rollout``), in
    the autoreset mode the batch was collected under: the path from a rollout to advantages that
    cannot mix the modes up.

    >>> import numpy as np, shmvec
    >>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
    >>> _ = envs.reset(seed=0)
    >>> def policy(obs):
    ...     return (obs[:, 2] > 0).astype(np.int64), {"value": obs[:, 0] * 0.5}
    >>> batch = envs.rollout(policy, num_steps=32)
    >>> advantages, returns = shmvec.rollout_gae(batch, last_values=policy(batch["next_obs"])[1]["value"])
    >>> advantages.shape
    (32, 4)
    >>> envs.close()

    Parameters
    ----------
    batch : dict
        What ``rollout`` returned. Under NEXT_STEP it holds ``valid`` (the reset step after an
        episode end is no transition; a truncated episode bootstraps from the next row, its final
        observation), and a multi-agent batch ``active`` (rows of agents that had left are no
        transitions either). Under SAME_STEP it holds ``final_obs``.
    last_values : array_like, shape [N]
        ``V(batch["next_obs"])``.
    values : str or array_like, default "value"
        The batch's extra holding ``V(obs[t])``, or the ``[T, N]`` values themselves.
    final_values : array_like, shape [T, N], optional
        SAME_STEP only: ``V(batch["final_obs"])``, the bootstrap of truncated episodes. Required
        when the batch has a truncated step: without it such a step would bootstrap nothing, as
        a terminated one does (pass zeros to ask for exactly that).
    gamma, lam, parallel
        As for :func:`gae`.

    Raises
    ------
    ValueError
        A batch of neither mode (no ``valid`` and no ``final_obs``), ``final_values`` under
        NEXT_STEP, or a SAME_STEP batch with truncations and no ``final_values``.
    """
    v = batch[values] if isinstance(values, str) else values
    args = (batch["rewards"], v, batch["terminations"], batch["truncations"], last_values)
    if "valid" in batch:
        if final_values is not None:
            raise ValueError(
                "rollout_gae: a NEXT_STEP batch bootstraps a truncated episode from the next row (its "
                "final observation): pass no final_values"
            )
        valid = batch["valid"] if "active" not in batch else batch["valid"] & batch["active"]
        return gae(*args, gamma=gamma, lam=lam, valid=valid, autoreset="next_step", parallel=parallel)
    if "final_obs" not in batch:
        raise ValueError(
            "rollout_gae takes the dict that ShmVecEnv.rollout returns: it has 'valid' (NEXT_STEP) or "
            "'final_obs' (SAME_STEP); for other rollouts call shmvec.gae with autoreset= and valid="
        )
    if final_values is None and np.any(batch["truncations"]):
        raise ValueError(
            "rollout_gae: this SAME_STEP batch has truncated episodes, which bootstrap from the value of "
            "their final observation: pass final_values=V(batch['final_obs']) (zeros to bootstrap nothing)"
        )
    valid = batch.get("active")
    return gae(*args, final_values, gamma, lam, valid=valid, autoreset="same_step", parallel=parallel)


def discounted_returns(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    last_values: Any,
    final_values: Any | None = None,
    gamma: float = 0.99,
    lam: float = 1.0,
    out: np.ndarray | None = None,
    *,
    valid: Any | None = None,
    autoreset: Any = _SAME_STEP_NAME,
    parallel: bool = False,
) -> np.ndarray:
    """Bootstrapped discounted returns (``lam=1``) or lambda-returns, without advantages.

    Same conventions and arguments as :func:`gae`; returns what ``gae(...)[1]`` returns,
    computed directly with one output array::

        G_t = r_t + gamma * bootstrap_t                                  if the episode ends at t
        G_t = r_t + gamma * ((1 - lam) * V(next_t) + lam * G_{t+1})       otherwise

    with ``G_T = V(s_T)`` (``last_values``) and ``G_t = values[t]`` where ``valid`` is False.
    With ``lam=1`` (the default) this is the discounted sum of rewards to the end of the
    episode or rollout, bootstrapped there; ``values`` are then only read for those bootstraps
    (and where ``valid`` is False).

    Parameters
    ----------
    rewards, values, terminated, truncated, last_values, final_values, gamma
        As in :func:`gae`.
    lam : float, default 1.0
        Lambda, in [0, 1].
    out : ndarray, optional
        Shape [T, N], dtype of ``values``; written and returned.
    valid, autoreset, parallel
        As in :func:`gae`.

    Returns
    -------
    ndarray, shape [T, N]
        The (lambda-)returns.

    Raises
    ------
    ValueError
        As in :func:`gae`.

    Examples
    --------
    >>> import numpy as np, shmvec
    >>> r = np.ones((3, 1)); v = np.zeros((3, 1))
    >>> f = np.zeros((3, 1), bool)
    >>> shmvec.discounted_returns(r, v, f, f, np.array([10.0]), gamma=0.5)[:, 0].tolist()
    [3.0, 4.0, 6.0]
    """
    r, v, te, tr, lv, fv, vd, mode = _prepare(
        rewards, values, terminated, truncated, last_values, final_values, valid, autoreset
    )
    mode |= _RET_ONLY
    if out is None:
        ret = np.empty(v.shape, v.dtype)
    else:
        ret = _output(out, "out", v)
        mode |= _CHECK_OUT
    # adv is a stand-in of the right type, never written in this mode
    _compute(r, v, te, tr, lv, fv, vd, ret, ret, gamma, lam, mode, parallel)
    return ret
