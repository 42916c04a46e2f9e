"""shmvec: shared-memory vectorized environments and a Numba GAE kernel.

>>> import shmvec
>>> envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
>>> obs, infos = envs.reset(seed=42)
>>> obs.shape
(8, 4)
>>> envs.close()
"""

from __future__ import annotations

from shmvec._lazy import lazy_exports

__version__ = "0.1.0"

# The env engine is imported lazily as well: `import shmvec` stays cheap, and the GAE kernel
# (which pulls in numba) is only loaded when it is used.
_LAZY = {
    "ShmVecEnv": "shmvec.vector_env",
    "make": "shmvec.make_vec",
    "AsyncRollout": "shmvec.async_rollout",
    "BaselinesVecEnv": "shmvec.baselines",
    "SubprocVecEnv": "shmvec.baselines",  # BaselinesVecEnv's classic name; SB3's is shmvec.sb3.SubprocVecEnv
    "AutoresetMode": "gymnasium.vector",
    "ShmVecError": "shmvec.errors",
    "WorkerError": "shmvec.errors",
    "WorkerDied": "shmvec.errors",
    "StepTimeout": "shmvec.errors",
    "PayloadError": "shmvec.errors",
    "ClosedError": "shmvec.errors",
    "NothingInFlightError": "shmvec.errors",
    "NonFiniteError": "shmvec.errors",
    "SnapshotError": "shmvec.errors",
    "ActorDied": "shmvec.errors",
    "EnvState": "shmvec.states",
    "save_state": "shmvec.states",
    "load_state": "shmvec.states",
    "gae": "shmvec.advantage",
    "discounted_returns": "shmvec.advantage",
    "rollout_gae": "shmvec.advantage",
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__, __dir__ = lazy_exports("shmvec", _LAZY, globals())
