"""The handshake: whatever an env reports reaches the calling process, and whatever fails before a
worker is ready comes back as an error naming the env, the phase and the worker's traceback."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from envs_for_tests import OddMetadataEnv, UnpicklableSpaceEnv, continuous_ppo_env

import shmvec

CONTEXTS = ["fork", "forkserver", "spawn"]


@pytest.mark.parametrize("context", CONTEXTS)
def test_continuous_ppo_wrappers_with_lambdas_run_as_in_sync(context):
    """The exact wrapper stack of a CleanRL-style continuous PPO script (two lambdas in its spec):
    shmvec builds it under every start method and steps it bit for bit as SyncVectorEnv does."""
    pytest.importorskip("mujoco", reason="mujoco is in the dev extra: make test installs it")
    fns = [continuous_ppo_env("HalfCheetah-v5") for _ in range(4)]
    ref = gym.vector.SyncVectorEnv(fns)
    with shmvec.ShmVecEnv(fns, num_workers=2, context=context) as envs:
        assert envs.metadata == ref.metadata and envs.render_mode == ref.render_mode
        assert envs.spec == ref.spec  # a vector env's own spec: None, as Gymnasium's
        specs = envs.get_attr("spec")  # the envs' specs, lambdas and all, carried by cloudpickle
        clip = specs[0].additional_wrappers[4].kwargs["func"]
        assert clip(np.array([20.0, -3.0])).tolist() == [10.0, -3.0]
        obs, _ = envs.reset(seed=3)
        ref_obs, _ = ref.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        rng = np.random.default_rng(0)
        for _ in range(20):
            actions = rng.uniform(-1, 1, size=(4, 6)).astype(np.float32)
            got, want = envs.step(actions), ref.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
    ref.close()


def test_metadata_that_cannot_be_pickled_is_carried_or_reduced():
    """A lambda in the metadata arrives working; a lock arrives as its documented reduced form;
    a lock in the spec's kwargs does not stop the vector env."""
    ref = gym.vector.SyncVectorEnv([OddMetadataEnv] * 2)
    with shmvec.ShmVecEnv([OddMetadataEnv] * 2, num_workers=2) as envs:
        assert envs.metadata["scale"](4) == 8
        assert envs.metadata["lock"].startswith("<not picklable: <unlocked _thread.lock object")
        assert {k: v for k, v in envs.metadata.items() if k not in ("scale", "lock")} == {
            k: v for k, v in ref.metadata.items() if k not in ("scale", "lock")
        }
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 2)
    ref.close()


@pytest.mark.parametrize("context", CONTEXTS)
def test_spaces_that_cannot_be_sent_fail_in_the_handshake_with_the_cause(context):
    with pytest.raises(shmvec.WorkerError) as info:
        shmvec.ShmVecEnv([UnpicklableSpaceEnv] * 4, num_workers=2, context=context)
    err = info.value
    assert (err.phase, err.env_index, err.worker_index) == ("handshake", 0, 0)
    assert err.exc_type == "TypeError" and "lock" in err.remote_message
    assert "worker.py" in err.remote_traceback and "during handshake" in str(err)


def test_a_failure_while_attaching_names_the_phase_and_carries_the_traceback(monkeypatch):
    """Forked workers inherit the patched stepper: building it raises after the segment is mapped."""

    def broken(*args, **kwargs):
        raise OSError("no room to attach")

    monkeypatch.setattr("shmvec.worker.Stepper", broken)
    with pytest.raises(shmvec.WorkerError, match="during attach: no room to attach") as info:
        shmvec.ShmVecEnv([OddMetadataEnv] * 2, num_workers=2, context="fork")
    assert info.value.phase == "attach" and "broken" in info.value.remote_traceback


def test_a_message_the_caller_cannot_read_names_the_env(tmp_path):
    """A worker's envs use a module that only the worker can import: the calling process cannot
    unpickle their spaces, and says so instead of crashing or hanging."""
    (tmp_path / "only_in_workers.py").write_text(
        "import gymnasium as gym\nclass Box(gym.spaces.Box):\n    pass\n", encoding="utf-8"
    )
    where = str(tmp_path)

    def make():
        sys.path.insert(0, where)
        import only_in_workers

        env = OddMetadataEnv()
        env.observation_space = only_in_workers.Box(0.0, 1.0, shape=(2,), dtype=np.float64)
        return env

    with pytest.raises(shmvec.WorkerError) as info:
        shmvec.ShmVecEnv([make] * 4, num_workers=2, context="fork")
    err = info.value
    assert err.phase == "construct, read by the caller" and err.env_index == 0
    assert err.exc_type == "ModuleNotFoundError" and "only_in_workers" in err.remote_message


class _HangsAsBuilt(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index: int) -> None:
        if index == 2:
            import time

            time.sleep(3600)


@pytest.mark.parametrize("phase", ["construct"])
def test_a_handshake_that_never_completes_names_the_worker_and_its_phase(phase, monkeypatch):
    """Env 2's constructor never returns: with no ``timeout`` the start-up deadline
    (``joining.START_S``, shortened here) ends it in StepTimeout naming worker 1 and the phase,
    and nothing is left behind (the autouse check)."""
    import functools

    from shmvec import joining

    monkeypatch.setattr(joining, "START_S", 2.0)
    with pytest.raises(shmvec.StepTimeout, match=rf"worker 1 \(envs 2..3\) did not finish within the start-up deadline \({phase}\)"):
        shmvec.ShmVecEnv([functools.partial(_HangsAsBuilt, i) for i in range(4)], num_workers=2)
