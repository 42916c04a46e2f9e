"""shmvec: shared-memory vectorized environments and a Numba GAE kernel.

>>> import shmvec
>>> envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
>>> obs, infos = envs.reset(seed=42)
>>> obs.shape
(8, 4)
>>> envs.close()
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The env engine is imported lazily as well: `import shmvec` stays cheap, and the GAE kernel
# (which pulls in numba) is only loaded when it is used.
_LAZY = {
    "ShmVecEnv": "shmvec.vector_env",
    "make": "shmvec.vector_env",
    "AsyncRollout": "shmvec.rollout",
    "SubprocVecEnv": "shmvec.baselines",
    "AutoresetMode": "gymnasium.vector",
    "ShmVecError": "shmvec.errors",
    "WorkerError": "shmvec.errors",
    "WorkerDied": "shmvec.errors",
    "StepTimeout": "shmvec.errors",
    "ClosedError": "shmvec.errors",
    "NonFiniteError": "shmvec.errors",
    "gae": "shmvec.advantage",
    "discounted_returns": "shmvec.advantage",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shmvec' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
