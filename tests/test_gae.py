"""Tests for shmvec.gae: property tests against plain-Python references written from the
formulas, the CleanRL and SB3 loops where their conventions coincide with ours, and an
episode simulation that lays the same episodes out under SAME_STEP and NEXT_STEP autoreset.

Compile budget: every distinct (dtype, layout) signature compiles once per kernel (then it is
cached on disk), so the tests draw from a few fixed layouts rather than arbitrary ones.
"""

from __future__ import annotations

import array
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmvec
from shmvec.advantage import discounted_returns, gae

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------


def ref_gae(r, v, te, tr, lv, fv=None, gamma=0.99, lam=0.95, valid=None, next_step=False):
    """Plain Python, float64, straight from the formulas of the issue / docstring."""
    T, N = np.shape(v)
    adv = np.zeros((T, N))
    for i in range(N):
        a_next = 0.0
        for t in reversed(range(T)):
            if valid is not None and not valid[t][i]:
                adv[t, i] = 0.0
                a_next = 0.0
                continue
            v_next = float(lv[i]) if t == T - 1 else float(v[t + 1][i])
            term, trunc = bool(te[t][i]), bool(tr[t][i])
            if term:
                boot = 0.0
            elif trunc:
                if fv is not None:
                    boot = float(fv[t][i])
                else:
                    boot = v_next if next_step else 0.0
            else:
                boot = v_next
            delta = float(r[t][i]) + gamma * boot - float(v[t][i])
            a = delta + gamma * lam * (0.0 if (term or trunc) else 1.0) * a_next
            adv[t, i] = a
            a_next = a
    return adv, adv + np.asarray(v, np.float64)


def ref_lambda_returns(r, v, te, tr, lv, fv=None, gamma=0.99, lam=1.0, valid=None,
                       next_step=False):  # fmt: skip
    """The lambda-return recursion, written independently of ref_gae."""
    T, N = np.shape(v)
    g = np.zeros((T, N))
    for i in range(N):
        g_next = float(lv[i])
        for t in reversed(range(T)):
            v_next = float(lv[i]) if t == T - 1 else float(v[t + 1][i])
            if valid is not None and not valid[t][i]:
                g[t, i] = g_next = float(v[t][i])
                continue
            term, trunc = bool(te[t][i]), bool(tr[t][i])
            if term:
                g[t, i] = float(r[t][i])
            elif trunc:
                boot = float(fv[t][i]) if fv is not None else (v_next if next_step else 0.0)
                g[t, i] = float(r[t][i]) + gamma * boot
            else:
                g[t, i] = float(r[t][i]) + gamma * ((1 - lam) * v_next + lam * g_next)
            g_next = g[t, i]
    return g


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """CleanRL's ppo.py loop. ``dones[t]`` is CleanRL's: whether obs[t] starts an episode,
    i.e. terminated|truncated of step t - 1 (dones[0] from the previous rollout);
    ``next_done`` is terminated|truncated of the last step."""
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages, advantages + values


def sb3_gae(rewards, values, terminated, truncated, final_values, last_values, last_dones,
            episode_starts, gamma, lam):  # fmt: skip
    """SB3: collect_rollouts folds the bootstrap of a time-limit truncation into the reward
    (``rewards[idx] += gamma * V(terminal_observation)``), then RolloutBuffer.
    compute_returns_and_advantage runs its loop over ``episode_starts`` (whether obs[t] is the
    first of an episode) and ``dones`` (of the last step)."""
    rewards = rewards.copy()
    bootstrap = truncated & ~terminated  # SB3's "TimeLimit.truncated"
    rewards[bootstrap] += gamma * final_values[bootstrap]
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    last_gae_lam = 0
    for step in reversed(range(T)):
        if step == T - 1:
            next_non_terminal = 1.0 - last_dones.astype(np.float64)
            next_values = last_values
        else:
            next_non_terminal = 1.0 - episode_starts[step + 1]
            next_values = values[step + 1]
        delta = rewards[step] + gamma * next_values * next_non_terminal - values[step]
        last_gae_lam = delta + gamma * lam * next_non_terminal * last_gae_lam
        advantages[step] = last_gae_lam
    return advantages, advantages + values


# ----------------------------------------------------------------------------------------
# Random rollouts
# ----------------------------------------------------------------------------------------

GAMMAS = [0.0, 0.5, 0.9, 0.99, 1.0]
LAMS = [0.0, 0.5, 0.95, 1.0]


def rollout(seed, T, N, p_term, p_trunc, dtype=np.float32):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, N)).astype(dtype)
    v = rng.normal(size=(T, N)).astype(dtype)
    te = rng.random((T, N)) < p_term
    tr = rng.random((T, N)) < p_trunc
    lv = rng.normal(size=N).astype(dtype)
    fv = rng.normal(size=(T, N)).astype(dtype)
    valid = rng.random((T, N)) < 0.8
    return r, v, te, tr, lv, fv, valid


def strided(a):
    """The same values in a non-contiguous array (every other column/element of a bigger
    one)."""
    a = np.asarray(a)
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    view = big[..., ::2]
    view[...] = a
    assert not view.flags.c_contiguous or a.shape[-1] <= 1
    return view


def tol(dtype, T=1):
    if np.dtype(dtype) == np.float32:
        return dict(rtol=2e-5 * max(T, 1), atol=2e-5 * max(T, 1))
    return dict(rtol=1e-11, atol=1e-11)


def as_flags(x, kind):
    if kind == "bool":
        return x
    return x.astype({"u8": np.uint8, "i64": np.int64, "f32": np.float32}[kind])


# ----------------------------------------------------------------------------------------
# Property tests against the formulas
# ----------------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 24),
    N=st.sampled_from([1, 2, 3, 8, 15, 16, 17, 40]),
    dtype=st.sampled_from([np.float32, np.float64]),
    flag_kind=st.sampled_from(["bool", "bool", "u8", "i64", "f32"]),
    p_term=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    gamma=st.sampled_from(GAMMAS),
    lam=st.sampled_from(LAMS),
    use_final=st.booleans(),
    use_valid=st.booleans(),
    next_step=st.booleans(),
    layout=st.sampled_from(["C", "C", "strided"]),
)
def test_matches_formula_reference(seed, T, N, dtype, flag_kind, p_term, p_trunc, gamma, lam,
                                   use_final, use_valid, next_step, layout):  # fmt: skip
    r, v, te, tr, lv, fv, valid = rollout(seed, T, N, p_term, p_trunc, dtype)
    kw = {}
    if use_final:
        kw["final_values"] = fv
    if use_valid or next_step:
        kw["valid"] = valid
    if next_step:
        kw["autoreset"] = "next_step"
    exp_adv, exp_ret = ref_gae(r, v, te, tr, lv, kw.get("final_values"), gamma, lam,
                               kw.get("valid"), next_step)  # fmt: skip
    exp_g = ref_lambda_returns(r, v, te, tr, lv, kw.get("final_values"), gamma, lam,
                               kw.get("valid"), next_step)  # fmt: skip
    np.testing.assert_allclose(exp_g, exp_ret, rtol=1e-9, atol=1e-9)  # the two references

    if layout == "strided":
        flag_kind = "bool"  # numeric flags are converted to (contiguous) bool anyway
    args = (r, v, as_flags(te, flag_kind), as_flags(tr, flag_kind), lv)
    if layout == "strided":
        args = tuple(strided(a) for a in args)
        kw = {k: strided(x) for k, x in kw.items() if k != "autoreset"} | (
            {"autoreset": "next_step"} if next_step else {}
        )
    adv, ret = gae(*args, gamma=gamma, lam=lam, **kw)
    assert adv.dtype == ret.dtype == np.dtype(dtype)
    assert adv.shape == ret.shape == (T, N)
    np.testing.assert_allclose(adv, exp_adv, **tol(dtype, T))
    np.testing.assert_allclose(ret, exp_ret, **tol(dtype, T))
    g = discounted_returns(*args, gamma=gamma, lam=lam, **kw)
    np.testing.assert_allclose(g, exp_ret, **tol(dtype, T))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 12),
    N=st.sampled_from([16, 33, 64]),
    dtype=st.sampled_from([np.float32, np.float64]),
    gamma=st.sampled_from(GAMMAS),
    lam=st.sampled_from(LAMS),
    options=st.sampled_from(["none", "final", "next_step", "returns"]),
)
def test_parallel_kernel_matches_serial(seed, T, N, dtype, gamma, lam, options):
    r, v, te, tr, lv, fv, valid = rollout(seed, T, N, 0.2, 0.2, dtype)
    kw = dict(gamma=gamma, lam=lam)
    if options == "final":
        kw["final_values"] = fv
    if options == "next_step":
        kw.update(valid=valid, autoreset="next_step")
    if options == "returns":
        serial = discounted_returns(r, v, te, tr, lv, parallel=False, **kw)
        par = discounted_returns(r, v, te, tr, lv, parallel=True, **kw)
        np.testing.assert_array_equal(par, serial)
        return
    serial = gae(r, v, te, tr, lv, parallel=False, **kw)
    par = gae(r, v, te, tr, lv, parallel=True, **kw)
    # Same arithmetic per env in both kernels: identical results.
    np.testing.assert_array_equal(par[0], serial[0])
    np.testing.assert_array_equal(par[1], serial[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_kernel_matches_serial_on_a_large_input(dtype):
    T, N = 256, 1024  # several blocks of envs when numba has more than one thread
    r, v, te, tr, lv, fv, _ = rollout(7, T, N, 0.01, 0.01, dtype)
    par = gae(r, v, te, tr, lv, fv, parallel=True)
    serial = gae(r, v, te, tr, lv, fv, parallel=False)
    np.testing.assert_array_equal(par[0], serial[0])
    np.testing.assert_array_equal(par[1], serial[1])
    np.testing.assert_array_equal(gae(r, v, te, tr, lv, fv)[0], serial[0])  # serial by default
    cols = [0, 1, 511, 512, 1023]  # both blocks, and both sides of the block boundary
    ea, _ = ref_gae(r[:, cols], v[:, cols], te[:, cols], tr[:, cols], lv[cols], fv[:, cols])
    np.testing.assert_allclose(par[0][:, cols], ea, **tol(dtype, 20))


# ----------------------------------------------------------------------------------------
# Edge cases of gamma / lambda, worked by hand
# ----------------------------------------------------------------------------------------


def test_lambda_zero_is_the_td_error():
    r, v, te, tr, lv, fv, _ = rollout(1, 9, 5, 0.2, 0.2, np.float64)
    adv, _ = gae(r, v, te, tr, lv, fv, gamma=0.9, lam=0.0)
    v_next = np.vstack([v[1:], lv[None]])
    boot = np.where(te, 0.0, np.where(tr, fv, v_next))
    np.testing.assert_allclose(adv, r + 0.9 * boot - v, rtol=1e-12, atol=1e-12)


def test_gamma_one_lambda_one_is_monte_carlo():
    # one env, episodes [0..2] terminated, [3..4] truncated (final value 10), [5..6] running
    r = np.arange(1.0, 8.0)[:, None]
    v = np.full((7, 1), 0.5)
    te = np.zeros((7, 1), bool)
    tr = np.zeros((7, 1), bool)
    te[2] = True
    tr[4] = True
    fv = np.full((7, 1), np.nan)  # read only where truncated
    fv[4] = 10.0
    lv = np.array([100.0])
    adv, ret = gae(r, v, te, tr, lv, fv, gamma=1.0, lam=1.0)
    expected_returns = [1 + 2 + 3, 2 + 3, 3, 4 + 5 + 10, 5 + 10, 6 + 7 + 100, 7 + 100]
    np.testing.assert_allclose(ret[:, 0], expected_returns)
    np.testing.assert_allclose(adv[:, 0], np.array(expected_returns) - 0.5)
    np.testing.assert_allclose(discounted_returns(r, v, te, tr, lv, fv, gamma=1.0)[:, 0],
                               expected_returns)  # fmt: skip
    # without final_values the truncation bootstraps nothing, like a termination
    _, ret = gae(r, v, te, tr, lv, gamma=1.0, lam=1.0)
    assert ret[3, 0] == 4 + 5 and ret[4, 0] == 5


def test_gamma_zero_is_the_immediate_reward():
    r, v, te, tr, lv, fv, valid = rollout(3, 6, 4, 0.3, 0.3, np.float64)
    adv, ret = gae(r, v, te, tr, lv, fv, gamma=0.0, lam=0.7)
    np.testing.assert_allclose(ret, r, atol=1e-12)
    np.testing.assert_allclose(discounted_returns(r, v, te, tr, lv, gamma=0.0), r)


def test_terminated_wins_over_truncated_and_unused_nan_does_not_leak():
    r = np.array([[1.0], [2.0]])
    v = np.zeros((2, 1))
    te = np.array([[False], [True]])
    tr = np.array([[False], [True]])  # both flags: terminated wins, no bootstrap
    fv = np.array([[np.nan], [5.0]])  # NaN where not truncated: never read
    for valid in (None, np.ones((2, 1), bool)):
        adv, ret = gae(r, v, te, tr, np.array([np.nan]), fv, gamma=0.5, lam=1.0, valid=valid)
        np.testing.assert_array_equal(ret[:, 0], [1.0 + 0.5 * 2.0, 2.0])
    # an invalid step's reward, flags and NaN value-to-be-bootstrapped are ignored
    valid = np.array([[True], [False]])
    r[1, 0] = np.nan
    adv, ret = gae(r, v, te, tr, np.array([np.nan]), fv, gamma=0.5, lam=1.0, valid=valid)
    np.testing.assert_array_equal(adv[:, 0], [1.0, 0.0])


def test_empty_and_single_step():
    for T, N in [(0, 3), (4, 0), (0, 0)]:
        z = np.zeros((T, N), np.float32)
        f = np.zeros((T, N), bool)
        adv, ret = gae(z, z, f, f, np.zeros(N, np.float32))
        assert adv.shape == ret.shape == (T, N) and adv.dtype == np.float32
        assert discounted_returns(z, z, f, f, np.zeros(N, np.float32)).shape == (T, N)
    r = np.array([[1.0, 2.0]], np.float32)
    v = np.array([[0.5, 0.5]], np.float32)
    adv, _ = gae(r, v, np.array([[False, True]]), np.zeros((1, 2), bool),
                 np.array([4.0, 4.0], np.float32), gamma=0.5)  # fmt: skip
    np.testing.assert_allclose(adv[0], [1.0 + 2.0 - 0.5, 2.0 - 0.5])


# ----------------------------------------------------------------------------------------
# CleanRL and SB3, where their conventions coincide with ours
# ----------------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 20),
    N=st.sampled_from([1, 4, 16, 17]),
    dtype=st.sampled_from([np.float32, np.float64]),
    p_term=st.sampled_from([0.0, 0.1, 0.5]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.5]),
    gamma=st.sampled_from(GAMMAS),
    lam=st.sampled_from(LAMS),
    prev_done=st.booleans(),
)
def test_matches_cleanrl_without_final_values(seed, T, N, dtype, p_term, p_trunc, gamma, lam,
                                              prev_done):  # fmt: skip
    """CleanRL treats a truncation as a termination (no bootstrap): exactly our default
    (SAME_STEP, no final_values), for any mix of flags."""
    r, v, te, tr, lv, _, _ = rollout(seed, T, N, p_term, p_trunc, dtype)
    done = te | tr
    # CleanRL's dones[t] = next_done stored before step t = done flag of step t - 1
    dones = np.vstack([np.full((1, N), prev_done), done[:-1]]).astype(dtype)
    exp_adv, exp_ret = cleanrl_gae(r, v, dones, lv, done[-1].astype(dtype), dtype(gamma),
                                   dtype(lam))  # fmt: skip
    adv, ret = gae(r, v, te, tr, lv, gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv, exp_adv, **tol(dtype, T))
    np.testing.assert_allclose(ret, exp_ret, **tol(dtype, T))
    # CleanRL stores its flags as float32: numeric flags work too
    adv2, _ = gae(r, v, te.astype(np.float32), tr.astype(np.float32), lv, gamma=gamma, lam=lam)
    np.testing.assert_array_equal(adv2, adv)


@SETTINGS
@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 20),
    N=st.sampled_from([1, 4, 16, 17]),
    p_term=st.sampled_from([0.0, 0.1, 0.5]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.5]),
    gamma=st.sampled_from(GAMMAS),
    lam=st.sampled_from(LAMS),
)
def test_matches_sb3_with_final_values(seed, T, N, p_term, p_trunc, gamma, lam):
    """SB3 bootstraps a time-limit truncation by adding gamma * V(terminal_observation) to
    the reward and treats the step as done: the same advantages as ours with final_values.
    (Without that reward trick, i.e. our no-final_values default, SB3 and CleanRL agree.)"""
    r, v, te, tr, lv, fv, _ = rollout(seed, T, N, p_term, p_trunc, np.float64)
    done = te | tr
    episode_starts = np.vstack([np.zeros((1, N)), done[:-1]]).astype(np.float64)
    exp_adv, exp_ret = sb3_gae(r, v, te, tr, fv, lv, done[-1], episode_starts, gamma, lam)
    adv, ret = gae(r, v, te, tr, lv, fv, gamma=gamma, lam=lam)
    np.testing.assert_allclose(adv, exp_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret, exp_ret, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------
# The same episodes under SAME_STEP and NEXT_STEP autoreset
# ----------------------------------------------------------------------------------------


def make_episodes(rng, n_episodes=40):
    """Episodes of one env: per episode, the values of its states (the last one is the final
    observation), the rewards of its transitions, and how it ended."""
    episodes = []
    for _ in range(n_episodes):
        length = int(rng.integers(1, 6))
        episodes.append(
            dict(
                values=rng.normal(size=length + 1),
                rewards=rng.normal(size=length),
                end="terminated" if rng.random() < 0.5 else "truncated",
            )
        )
    return episodes


def simulate(episodes, T, mode, start_pos, start_pending):
    """Lay the episodes of one env out over T steps the way a vector env in ``mode`` returns
    them. Returns the per-step arrays, V(obs_T) and the list of real transitions
    (t, reward, V(s), V(true next state), terminated, ended)."""
    values = np.zeros(T)
    rewards = np.zeros(T)
    term = np.zeros(T, bool)
    trunc = np.zeros(T, bool)
    final = np.full(T, np.nan)
    valid = np.ones(T, bool)
    transitions = []
    k, j = 0, min(start_pos, len(episodes[0]["rewards"]) - 1)  # episode, position in it
    pending = mode == "next_step" and start_pending  # next step is a reset step
    if pending:
        k, j = -1, None  # the obs is the final observation of the episode before
    for t in range(T):
        if pending:
            # NEXT_STEP reset step: action ignored, reward 0, flags False; the obs on which
            # the "action" was taken is the previous episode's final observation
            values[t] = episodes[k]["values"][-1] if k >= 0 else 7.0
            valid[t] = False
            k, j, pending = k + 1, 0, False
            continue
        ep = episodes[k]
        values[t] = ep["values"][j]
        rewards[t] = ep["rewards"][j]
        length = len(ep["rewards"])
        ended = j + 1 == length
        if ended:
            term[t] = ep["end"] == "terminated"
            trunc[t] = ep["end"] == "truncated"
            final[t] = ep["values"][-1]
        transitions.append((t, rewards[t], values[t], ep["values"][j + 1], term[t], ended))
        if ended:
            if mode == "same_step":
                k, j = k + 1, 0  # the returned obs is already the next episode's first
            else:
                pending = True  # the returned obs is the final one; a reset step follows
                j = length
        else:
            j += 1
    if pending:
        last_value = episodes[k]["values"][-1]  # obs_T is the final observation
    else:
        last_value = episodes[k]["values"][j]
    return dict(values=values, rewards=rewards, term=term, trunc=trunc, final=final,
                valid=valid, last_value=last_value, transitions=transitions)  # fmt: skip


def ground_truth(transitions, T, gamma, lam):
    adv = np.full(T, np.nan)
    a_next = 0.0
    for t, rew, v_s, v_next, terminated, ended in reversed(transitions):
        delta = rew + gamma * (0.0 if terminated else v_next) - v_s
        a = delta + (0.0 if ended else gamma * lam * a_next)
        adv[t] = a_next = a
    return adv


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 30),
    N=st.sampled_from([1, 5, 16]),
    gamma=st.sampled_from(GAMMAS),
    lam=st.sampled_from(LAMS),
)
def test_episode_simulation_same_step_and_next_step(seed, T, N, gamma, lam):
    rng = np.random.default_rng(seed)
    envs = [make_episodes(rng) for _ in range(N)]
    # each env starts mid-episode, or (NEXT_STEP) right after an episode ended
    starts = [(int(rng.integers(0, 5)), bool(rng.random() < 0.3)) for _ in range(N)]
    for mode in ("same_step", "next_step"):
        sims = [simulate(eps, T, mode, pos, pend) for eps, (pos, pend) in zip(envs, starts)]

        def stack(key, sims=sims):
            return np.stack([s[key] for s in sims], axis=1)

        v, r = stack("values"), stack("rewards")
        te, tr, valid = stack("term"), stack("trunc"), stack("valid")
        lv = np.array([s["last_value"] for s in sims])
        expected = np.stack([ground_truth(s["transitions"], T, gamma, lam) for s in sims], 1)
        if mode == "same_step":
            assert valid.all()
            adv, ret = gae(r, v, te, tr, lv, stack("final"), gamma=gamma, lam=lam)
        else:
            # NEXT_STEP: no final_values needed; the reset steps are masked out
            adv, ret = gae(r, v, te, tr, lv, gamma=gamma, lam=lam, valid=valid,
                           autoreset="next_step")  # fmt: skip
            assert (adv[~valid] == 0).all() and (ret[~valid] == v[~valid]).all()
            # the documented alternative: values[t + 1] passed as final_values
            fv = np.vstack([v[1:], lv[None]])
            adv2, _ = gae(r, v, te, tr, lv, fv, gamma=gamma, lam=lam, valid=valid)
            np.testing.assert_allclose(adv2, adv, rtol=1e-12, atol=1e-12)
        real = ~np.isnan(expected)
        assert (real == valid).all()
        np.testing.assert_allclose(adv[real], expected[real], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(ret[real], expected[real] + v[real], rtol=1e-10, atol=1e-10)
        g = discounted_returns(r, v, te, tr, lv, None if mode == "next_step" else stack("final"),
                               gamma=gamma, lam=lam, valid=valid, autoreset=mode)  # fmt: skip
        np.testing.assert_allclose(g, ret, rtol=1e-10, atol=1e-10)


def test_gymnasium_vector_env_under_both_autoreset_modes():
    """The recipes of docs/gae.md on a real vector env: CartPole with a 7-step time limit
    (many truncations, some terminations), a deterministic policy and a made-up value
    function, collected under SAME_STEP (final values from infos["final_obs"]) and NEXT_STEP
    (valid mask, no final values). Both see the same episodes, and every transition of an
    episode that ends inside both rollouts gets the same advantage."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    w = np.array([0.5, -1.0, 2.0, 0.25], np.float32)

    def value(obs):
        return (np.asarray(obs, np.float32) @ w + 1.0).astype(np.float32)

    def policy(obs):
        return (obs[:, 2] + 0.3 * obs[:, 3] > 0).astype(np.int64)

    N, T = 3, 40
    per_mode = {}
    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
        envs = SyncVectorEnv(
            [lambda: gym.make("CartPole-v1", max_episode_steps=7) for _ in range(N)],
            autoreset_mode=mode,
        )
        obs, _ = envs.reset(seed=[11, 12, 13])
        rewards, values = np.zeros((T, N), np.float32), np.zeros((T, N), np.float32)
        term, trunc = np.zeros((T, N), bool), np.zeros((T, N), bool)
        final_values = np.zeros((T, N), np.float32)
        valid = np.ones((T, N), bool)
        prev_done = np.zeros(N, bool)
        for t in range(T):
            values[t] = value(obs)
            if mode is AutoresetMode.NEXT_STEP:
                valid[t] = ~prev_done
            obs, rewards[t], term[t], trunc[t], infos = envs.step(policy(obs))
            prev_done = term[t] | trunc[t]
            cut = trunc[t] & ~term[t]
            if mode is AutoresetMode.SAME_STEP and cut.any():
                final_values[t, cut] = value(np.stack(infos["final_obs"][cut]))
        envs.close()
        last_values = value(obs)
        if mode is AutoresetMode.SAME_STEP:
            adv, _ = gae(rewards, values, term, trunc, last_values, final_values)
        else:
            adv, _ = gae(rewards, values, term, trunc, last_values, valid=valid, autoreset=mode)
        # advantage of (env, episode, step in episode), for episodes that ended in the rollout
        table = {}
        for i in range(N):
            ep, k, rows = 0, 0, []
            for t in range(T):
                if not valid[t, i]:
                    continue
                rows.append(((i, ep, k), adv[t, i]))
                k += 1
                if term[t, i] or trunc[t, i]:
                    table.update(rows)
                    ep, k, rows = ep + 1, 0, []
        per_mode[mode] = table
    same, nxt = per_mode[AutoresetMode.SAME_STEP], per_mode[AutoresetMode.NEXT_STEP]
    common = sorted(set(same) & set(nxt))
    assert len(common) > 60 and len(common) == len(nxt)
    np.testing.assert_allclose([same[k] for k in common], [nxt[k] for k in common],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_next_step_accepts_gymnasium_autoreset_mode():
    from gymnasium.vector import AutoresetMode

    r, v, te, tr, lv, _, valid = rollout(5, 8, 3, 0.2, 0.3, np.float32)
    a = gae(r, v, te, tr, lv, valid=valid, autoreset=AutoresetMode.NEXT_STEP)
    b = gae(r, v, te, tr, lv, valid=valid, autoreset="next_step")
    np.testing.assert_array_equal(a[0], b[0])
    c = gae(r, v, te, tr, lv, autoreset=AutoresetMode.SAME_STEP)
    d = gae(r, v, te, tr, lv)
    np.testing.assert_array_equal(c[0], d[0])


# ----------------------------------------------------------------------------------------
# Inputs: types, layouts, dtypes; outputs
# ----------------------------------------------------------------------------------------


def test_dtype_follows_values_and_mixed_inputs_are_converted():
    r, v, te, tr, lv, fv, _ = rollout(11, 7, 5, 0.2, 0.2, np.float64)
    exp_adv, _ = ref_gae(r, v, te, tr, lv, fv)
    v32 = v.astype(np.float32)
    adv, ret = gae(r, v32, te, tr, lv, fv)  # float64 rewards/last/final with float32 values
    assert adv.dtype == ret.dtype == np.float32
    np.testing.assert_allclose(adv, exp_adv, rtol=1e-4, atol=1e-4)
    adv, _ = gae(np.round(r * 4).astype(np.int64), v, te.astype(np.int8), tr.astype(np.float64),
                 lv, fv)  # fmt: skip
    exp, _ = ref_gae(np.round(r * 4), v, te, tr, lv, fv)
    np.testing.assert_allclose(adv, exp, rtol=1e-12, atol=1e-12)


def test_lists_buffer_protocol_and_fortran_order():
    r, v, te, tr, lv, fv, _ = rollout(2, 5, 3, 0.3, 0.3, np.float64)
    expected = gae(r, v, te, tr, lv, fv)[0]
    got = gae(r.tolist(), v.tolist(), te.tolist(), tr.tolist(), lv.tolist(), fv.tolist())[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got.dtype == np.float64
    mv = memoryview(np.ascontiguousarray(v))  # buffer protocol, no copy through np.asarray
    got = gae(memoryview(r), mv, memoryview(te), memoryview(tr), array.array("d", lv),
              memoryview(fv))[0]  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    got = gae(*(np.asfortranarray(a) for a in (r, v, te, tr)), lv, np.asfortranarray(fv))[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_out_is_written_in_place_and_returned():
    r, v, te, tr, lv, fv, _ = rollout(4, 9, 20, 0.2, 0.2, np.float32)
    expected = gae(r, v, te, tr, lv, fv)
    adv = np.full_like(v, np.nan)
    ret = np.full_like(v, np.nan)
    got = gae(r, v, te, tr, lv, fv, out=(adv, ret))
    assert got[0] is adv and got[1] is ret
    np.testing.assert_array_equal(adv, expected[0])
    np.testing.assert_array_equal(ret, expected[1])
    g = np.empty_like(v)
    assert discounted_returns(r, v, te, tr, lv, fv, lam=0.95, out=g) is g
    np.testing.assert_allclose(g, expected[1], rtol=1e-5, atol=1e-5)
    # strided outputs (a slice of a bigger buffer)
    buf = np.zeros((2, 9, 40), np.float32)
    got = gae(r, v, te, tr, lv, fv, out=(buf[0, :, ::2], buf[1, :, ::2]))
    np.testing.assert_array_equal(buf[0, :, ::2], expected[0])
    assert (buf[:, :, 1::2] == 0).all()


def test_out_rejects_bad_and_overlapping_arrays():
    r, v, te, tr, lv, fv, _ = rollout(4, 6, 4, 0.2, 0.2, np.float32)
    ok = np.empty_like(v)
    with pytest.raises(ValueError, match=r"out\[0\] \(advantages\).*shape \(6, 4\) dtype float32"):
        gae(r, v, te, tr, lv, out=(np.empty((6, 4), np.float64), ok))
    with pytest.raises(ValueError, match=r"out\[1\] \(returns\).*got shape \(4, 6\)"):
        gae(r, v, te, tr, lv, out=(ok, np.empty((4, 6), np.float32)))
    with pytest.raises(ValueError, match="out: expected a pair"):
        gae(r, v, te, tr, lv, out=ok)
    ro = np.empty_like(v)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        gae(r, v, te, tr, lv, out=(np.empty_like(v), ro))
    with pytest.raises(ValueError, match="must not share memory with the inputs"):
        gae(r, v, te, tr, lv, out=(r, ok))
    with pytest.raises(ValueError, match="must not share memory with the inputs"):
        gae(r, v, te, tr, lv, fv, out=(ok, fv))
    with pytest.raises(ValueError, match="advantages and returns arrays must not share"):
        gae(r, v, te, tr, lv, out=(ok, ok))
    with pytest.raises(ValueError, match="must not share memory with the inputs"):
        discounted_returns(r, v, te, tr, lv, out=v)
    both = np.empty((2,) + v.shape, np.float32)  # two halves of one buffer are fine
    gae(r, v, te, tr, lv, out=(both[0], both[1]))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(values=np.zeros((3, 4), np.int64)), r"values: expected a \[T, N\] float32 or "
         r"float64 array, got shape \(3, 4\) dtype int64"),
        (dict(values=np.zeros(4, np.float32)), r"values: .*got shape \(4,\)"),
        (dict(rewards=np.zeros((3, 5), np.float32)), r"rewards: expected shape \(3, 4\), "
         r"got shape \(3, 5\)"),
        (dict(rewards=np.zeros((3, 4), complex)), r"rewards: expected a real .* got complex128"),
        (dict(terminated=np.zeros((4, 3), bool)), r"terminated: expected shape \(3, 4\)"),
        (dict(truncated=np.array([["a"] * 4] * 3)), r"truncated: expected a bool or numeric "
         r"dtype, got <U1"),
        (dict(last_values=np.zeros(3, np.float32)), r"last_values: expected shape \(4,\), "
         r"got shape \(3,\)"),
        (dict(final_values=np.zeros((3, 3), np.float32)), r"final_values: expected shape"),
        (dict(valid=np.zeros((2, 4), bool)), r"valid: expected shape \(3, 4\)"),
        (dict(gamma=1.5), r"gamma: expected a number in \[0, 1\], got 1.5"),
        (dict(gamma=float("nan")), r"gamma: expected"),
        (dict(lam=-0.1), r"lam: expected a number in \[0, 1\], got -0.1"),
        (dict(autoreset="sometimes"), r"autoreset: expected 'same_step' or 'next_step'"),
        (dict(autoreset="next_step"), r"valid: required with autoreset='next_step'"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(change, match):
    kw = dict(
        rewards=np.zeros((3, 4), np.float32),
        values=np.zeros((3, 4), np.float32),
        terminated=np.zeros((3, 4), bool),
        truncated=np.zeros((3, 4), bool),
        last_values=np.zeros(4, np.float32),
    )
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        gae(**kw)
    with pytest.raises(ValueError, match=match):
        discounted_returns(**kw)


# ----------------------------------------------------------------------------------------
# Package integration: lazy import, shmvec.gae callable, on-disk cache
# ----------------------------------------------------------------------------------------


def run_python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_shmvec_does_not_import_numba_and_gae_is_callable_either_way():
    out = run_python(
        "import sys, shmvec; assert 'numba' not in sys.modules and 'shmvec.advantage' not in "
        "sys.modules; import numpy as np; z = np.zeros((2, 3)); f = z != 0\n"
        "print(shmvec.gae(z, z, f, f, z[0])[0].shape, shmvec.discounted_returns(z, z, f, f, "
        "z[0]).shape)"
    )
    assert out.split() == ["(2,", "3)", "(2,", "3)"]
    # importing the module first leaves shmvec.gae the function (the module has another name)
    out = run_python(
        "import shmvec.advantage, shmvec, numpy as np; z = np.ones((2, 1)); f = z == 0\n"
        "print(shmvec.gae(z, z, f, f, z[0], gamma=0.5, lam=1.0)[0].ravel().tolist())"
    )
    assert out.strip() == "[0.75, 0.5]"
    assert callable(shmvec.gae)


def test_kernels_are_cached_on_disk():
    code = (
        "import numpy as np; from shmvec import gae\n"
        "from shmvec.advantage import _kernel\n"
        "z = np.zeros((3, 2), np.float32); f = z != 0\n"
        "gae(z, z, f, f, z[0])\n"
        "s = _kernel.stats; print(sum(s.cache_hits.values()), sum(s.cache_misses.values()))"
    )
    run_python(code)  # compiles (or loads) and saves
    hits, misses = map(int, run_python(code).split())
    assert hits >= 1 and misses == 0



# -- rollout_gae: the batch knows its autoreset mode ----------------------------------------------
def _cartpole_rollout(mode, steps=60):
    def policy(obs):
        return (obs[:, 2] > 0).astype(np.int64), {"value": (obs[:, 0] * 0.5 + obs[:, 2]).astype(np.float32)}

    envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, autoreset_mode=mode, max_episode_steps=20)
    envs.reset(seed=0)
    batch = envs.rollout(policy, num_steps=steps)
    batch = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
    envs.close()
    return batch, policy


def test_rollout_gae_under_next_step_masks_the_reset_rows():
    batch, policy = _cartpole_rollout("next_step")
    last = policy(batch["next_obs"])[1]["value"]
    assert not batch["valid"].all() and batch["truncations"].any()  # resets and time limits happened
    adv, ret = shmvec.rollout_gae(batch, last)
    want = gae(batch["rewards"], batch["value"], batch["terminations"], batch["truncations"], last,
               autoreset="next_step", valid=batch["valid"])
    assert np.array_equal(adv, want[0]) and np.array_equal(ret, want[1])
    # What the silent mistake gives (the default mode, no mask): different advantages.
    wrong = gae(batch["rewards"], batch["value"], batch["terminations"], batch["truncations"], last)
    assert not np.allclose(adv, wrong[0])
    with pytest.raises(ValueError, match="pass no final_values"):
        shmvec.rollout_gae(batch, last, final_values=np.zeros_like(batch["value"]))


def test_rollout_gae_under_same_step_wants_the_final_values():
    batch, policy = _cartpole_rollout("same_step")
    last = policy(batch["next_obs"])[1]["value"]
    final = policy(batch["final_obs"].reshape(-1, 4))[1]["value"].reshape(batch["value"].shape)
    assert batch["truncations"].any()
    with pytest.raises(ValueError, match=r"pass final_values=V\(batch\['final_obs'\]\)"):
        shmvec.rollout_gae(batch, last)
    adv, ret = shmvec.rollout_gae(batch, last, final_values=final)
    want = gae(batch["rewards"], batch["value"], batch["terminations"], batch["truncations"], last, final)
    assert np.array_equal(adv, want[0]) and np.array_equal(ret, want[1])
    with pytest.raises(ValueError, match="has 'valid' \\(NEXT_STEP\\) or 'final_obs'"):
        shmvec.rollout_gae({k: v for k, v in batch.items() if k != "final_obs"}, last, final_values=final)
