"""The CleanRL-style PPO example (examples/ppo_cartpole.py): it learns, and its loop is exact."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
