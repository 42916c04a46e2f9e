"""The CleanRL-style PPO example (examples/ppo_cartpole.py): it learns, and its loop is exact."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # the dev extra installs it: this only guards odd setups
import torch
from gymnasium.vector import SyncVectorEnv

torch.set_num_threads(1)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    """Import an example script as a module (examples/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: dataclasses and pickling look the module up
    spec.loader.exec_module(module)
    # Its env factories travel by value, as they do when the script runs as __main__ (a worker
    # from the forkserver, once this process runs other threads, cannot import it by name).
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture(scope="module")
def ppo():
    return load("ppo_cartpole")


def test_ppo_improves_on_random_play(ppo):
    # Random play on CartPole averages about 22 per episode; 25k steps of PPO get 80-120
    # across seeds (seed 0: about 120).
    stats = ppo.train(total_steps=25_000, num_envs=8, seed=0, num_workers=2, progress=False)
    assert stats["steps"] == 24_576  # whole rollouts of 8 x 64
    assert stats["episodes"] > 100
    assert stats["avg_return"] > 60, stats["history"][-5:]


def test_same_run_on_sync_vector_env(ppo):
    """ShmVecEnv is bit-identical to SyncVectorEnv, so one seeded run is the same on both; this
    also checks the loop's two ways of counting episode returns against each other."""

    def sync(env_fns, autoreset_mode):
        return SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)

    ours = ppo.train(total_steps=2_048, num_envs=4, seed=3, num_workers=2, progress=False)
    ref = ppo.train(total_steps=2_048, num_envs=4, seed=3, make_vector_env=sync, progress=False)
    assert ours["episodes"] == ref["episodes"] > 0
    assert ours["history"] == ref["history"]


def test_truncated_episodes_bootstrap_from_final_values(ppo, monkeypatch):
    """Where an episode is cut by the time limit, gae gets V(final obs) in final_values."""
    import shmvec

    seen = []
    real_gae = shmvec.gae

    def spy(rewards, values, terminated, truncated, last_values, final_values=None, **kwargs):
        seen.append((truncated & ~terminated, final_values.copy()))  # the loop reuses its buffer
        return real_gae(rewards, values, terminated, truncated, last_values, final_values=final_values, **kwargs)

    monkeypatch.setattr(shmvec, "gae", spy)
    # A 12-step time limit: most early episodes (about 22 steps long at random) are truncated.
    monkeypatch.setattr(ppo, "MakeEnv", lambda env_id: lambda: __import__("gymnasium").make(env_id, max_episode_steps=12))
    ppo.train(total_steps=512, num_envs=4, seed=0, num_workers=2, progress=False)
    cut, final_values = seen[0]
    assert cut.any()
    assert (final_values[cut] != 0).all()  # a critic value, not the zero of "no bootstrap"
    assert (final_values[~cut] == 0).all()


def test_cli(ppo, capsys):
    stats = ppo.main(["--total-steps", "1024", "--num-envs", "2", "--seed", "5", "--num-workers", "1"])
    assert stats["steps"] == 1024
    out = capsys.readouterr()
    assert "steps/s" in out.out and "average return" in out.out
    assert "\rstep" in out.err  # the progress line


# -- examples/ppo_rollout.py and examples/ppo_ray.py: PPO through envs.rollout -----------------


@pytest.fixture(scope="module")
def ppo_rollout(ppo):
    return load("ppo_rollout")


def test_rollout_ppo_improves_on_random_play(ppo_rollout):
    # The same agent and update as ppo_cartpole; seed 0 reaches about 84 at 25k steps.
    stats = ppo_rollout.train(total_steps=25_000, num_envs=8, seed=0, num_workers=2, progress=False)
    assert stats["steps"] == 24_576
    assert stats["episodes"] > 100
    assert stats["avg_return"] > 60, stats["history"][-5:]
    # One reset row per episode end is not a transition.
    assert 0.9 < stats["valid_fraction"] < 1.0


def test_rollout_ppo_trains_on_valid_rows_with_next_step_gae(ppo_rollout, monkeypatch):
    """The update sees exactly the valid rows, and gae gets the NEXT_STEP mask (from rollout_gae)."""
    import shmvec.advantage

    updates, gae_calls = [], []
    real_update, real_gae = ppo_rollout.ppo_update, shmvec.advantage.gae

    def spy_update(agent, optimizer, hp, obs, actions, logprobs, advantages, returns, values):
        updates.append((obs.copy(), actions.copy(), advantages.copy()))
        return real_update(agent, optimizer, hp, obs, actions, logprobs, advantages, returns, values)

    def spy_gae(*args, **kwargs):
        gae_calls.append((kwargs["autoreset"], kwargs["valid"].copy()))
        return real_gae(*args, **kwargs)

    monkeypatch.setattr(ppo_rollout, "ppo_update", spy_update)
    monkeypatch.setattr(shmvec.advantage, "gae", spy_gae)
    stats = ppo_rollout.train(total_steps=2_048, num_envs=4, seed=1, num_workers=2, progress=False)
    assert len(updates) == len(gae_calls) == 8  # 2048 / (4 x 64)
    valid_rows = sum(int(v.sum()) for _, v in gae_calls)
    assert valid_rows == sum(len(o) for o, _, _ in updates) == round(stats["valid_fraction"] * 2_048)
    assert valid_rows < 2_048  # episodes ended, so some rows were resets
    assert all(mode == "next_step" for mode, _ in gae_calls)
    for obs, actions, advantages in updates:
        assert obs.shape[1:] == (4,) and len(obs) == len(actions) == len(advantages)
        assert np.isfinite(advantages).all()


def test_rollout_ppo_cli(ppo_rollout, capsys):
    stats = ppo_rollout.main(["--total-steps", "512", "--num-envs", "2", "--seed", "5", "--num-workers", "1"])
    assert stats["steps"] == 512
    assert "average return" in capsys.readouterr().out


def test_ppo_trains_through_ray_actors(ppo_rollout, ray_cluster):
    ppo_ray = load("ppo_ray")
    # Two actors of 4 envs each. Ray's actors sample from their own torch RNGs, so the run is
    # not reproducible; 16k steps reach 49-59 on four seeds (random play: about 22).
    stats = ppo_ray.train(total_steps=16_384, num_envs=8, seed=0, num_actors=2, progress=False)
    assert stats["steps"] == 16_384
    assert stats["episodes"] > 100
    assert stats["avg_return"] > 35, stats["history"][-5:]


def test_multiagent_ppo_beats_random_play():
    """Parameter-sharing PPO on simple_spread (3 agents, 25 steps): random play averages about
    -27 per agent and episode (measured over 300 agent episodes: -27.2 +- 0.4); 100k agent steps of PPO
    get about -23."""
    pytest.importorskip("mpe2")
    ma = load("ppo_multiagent")
    stats = ma.train(total_steps=100_000, num_envs=8, seed=0, num_workers=2, progress=False)
    assert stats["steps"] == 100_000 - 100_000 % (50 * 24) and stats["episodes"] > 240
    assert stats["avg_return"] > -25.0, stats["history"][-5:]
    assert 0.9 < stats["valid_fraction"] < 1.0  # the reset rows after each episode are not transitions


# -- examples/ppo_checkpoint.py and examples/go_explore.py: snapshots in a training loop ------


def test_ppo_resumed_from_a_checkpoint_in_a_new_process_equals_the_uninterrupted_run(tmp_path):
    import subprocess

    def run(folder, *args):
        out = subprocess.run([sys.executable, str(EXAMPLES / "ppo_checkpoint.py"), "--iterations", "6", "--every",
                              "3", "--checkpoint", str(tmp_path / folder), *args],
                             check=True, capture_output=True, text=True, timeout=300).stdout
        return [float(line) for line in out.split()]

    full = run("full")
    interrupted = run("cut", "--stop-after", "4")  # the last checkpoint is after iteration 3
    resumed = run("cut", "--resume")
    assert len(full) == 6 and interrupted == full[:4]
    assert resumed == full[3:]  # model, optimizer, torch's RNG and the envs, continued bit for bit


def test_go_explore_returns_to_cells_and_reaches_the_flag():
    go = load("go_explore")
    found = go.explore(rounds=150, num_envs=16, explore_steps=16, seed=0, num_workers=2)
    assert found["best_position"] >= go.GOAL, found
    assert go.random_play(found["steps"], 16, seed=0) < go.GOAL  # what the same steps give without returning
