"""conftest.py of a conformance run (copied there by ``tests/conformance/run.py``).

With ``SHMVEC_CONFORMANCE_TARGET=shmvec`` it puts shmvec's classes where the upstream test
files look for theirs, before those files are imported: Gymnasium's ``AsyncVectorEnv``
becomes a :class:`shmvec.ShmVecEnv` and SB3's ``SubprocVecEnv`` becomes
:class:`shmvec.sb3.SubprocVecEnv`. With ``upstream`` it changes nothing: the same files then
run against the upstream classes, so that a failure there is known not to be shmvec's.
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

TARGET = os.environ.get("SHMVEC_CONFORMANCE_TARGET", "shmvec")
SUITE = os.environ.get("SHMVEC_CONFORMANCE_SUITE", "gymnasium")


def _swap(modules: list[str], name: str, replacement: type) -> None:
    """Bind ``name`` to ``replacement`` in every module of ``modules`` that imports it."""
    for module_name in modules:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            setattr(module, name, replacement)


def _gymnasium() -> None:
    import gymnasium.vector
    from gymnasium.vector.async_vector_env import AsyncVectorEnv as Upstream

    from shmvec import ShmVecEnv

    upstream_signature = inspect.signature(Upstream.__init__)
    # AsyncVectorEnv's keywords that ShmVecEnv does not take (shared_memory, daemon, worker,
    # observation_mode) are dropped: shmvec always uses shared memory and its own workers.
    taken = set(inspect.signature(ShmVecEnv.__init__).parameters) - {"self"}

    class AsyncVectorEnv(ShmVecEnv):
        """ShmVecEnv called with AsyncVectorEnv's signature."""

        def __init__(self, env_fns: Any, *args: Any, **kwargs: Any) -> None:
            bound = upstream_signature.bind(self, env_fns, *args, **kwargs).arguments
            kept = {key: value for key, value in bound.items() if key in taken and key != "env_fns"}
            super().__init__(env_fns, **kept)

    _swap(["gymnasium.vector", "gymnasium.vector.async_vector_env"], "AsyncVectorEnv", AsyncVectorEnv)
    assert gymnasium.vector.AsyncVectorEnv is AsyncVectorEnv


def _sb3() -> None:
    from shmvec.sb3 import SubprocVecEnv

    _swap(
        [
            "stable_baselines3.common.vec_env",
            "stable_baselines3.common.vec_env.subproc_vec_env",
            "stable_baselines3.common.env_util",
        ],
        "SubprocVecEnv",
        SubprocVecEnv,
    )


if TARGET == "shmvec":
    {"gymnasium": _gymnasium, "sb3": _sb3}[SUITE]()
elif TARGET != "upstream":
    raise RuntimeError(f"SHMVEC_CONFORMANCE_TARGET must be 'shmvec' or 'upstream', got {TARGET!r}")
