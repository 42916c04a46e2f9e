"""The calling process's Gymnasium registrations, carried to workers that do not inherit them.

A forked worker starts with the calling process's registry. A spawned one (the default start
method on macOS and Windows; ``context="spawn"`` or ``"forkserver"`` anywhere) starts a new
interpreter and imports the user's main module again as ``__mp_main__``, where the code under
``if __name__ == "__main__":`` does not run: an env registered there (``gym.register(...)``,
``gym.register_envs(ale_py)``) is unknown to the worker's ``gym.make``, which raises
``NameNotFound``. ``SyncVectorEnv`` runs such envs; so does shmvec: the registry's entries that a
new interpreter would not have (every entry point outside Gymnasium's own envs) travel with the
env factories, and a worker registers those it lacks before it builds its envs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["carried", "quiet_overrides", "register_missing"]

# Entry points that `import gymnasium` registers by itself in any interpreter.
_GYMNASIUM_OWN = ("gymnasium.envs.",)


def carried() -> list[Any]:
    """The specs of the calling process's registry that a new interpreter may lack, each of
    which pickles (cloudpickle: an entry point defined in the user's script travels by value).
    """
    import sys

    if "gymnasium" not in sys.modules:  # nothing registered, nothing to carry
        return []
    import cloudpickle
    from gymnasium.envs.registration import registry

    specs = []
    for spec in registry.values():
        entry = spec.entry_point
        if isinstance(entry, str) and entry.startswith(_GYMNASIUM_OWN):
            continue
        try:
            cloudpickle.dumps(spec)
        except Exception:  # an entry point that cannot travel: the worker's gym.make will say so
            continue
        specs.append(spec)
    return specs


@contextmanager
def quiet_overrides(specs: list[Any]) -> Iterator[None]:
    """No "Overriding environment ... already in registry" warning for the ids of ``specs``
    inside the block: a worker's factory that imports a package registering its envs at import
    (``ale_py``) registers again what :func:`register_missing` carried, hundreds of warnings the
    user did not cause (registered at module level, the same import in the main process warns
    nothing either).
    """
    if not specs:
        yield
        return
    import re
    import warnings

    ids = "|".join(re.escape(spec.id) for spec in specs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=rf".*Overriding environment ({ids}) already in registry")
        yield


def register_missing(specs: list[Any]) -> None:
    """Register each of ``specs`` whose id this process's registry lacks (in a worker, before its
    envs are built); an id it has already is left as it is.
    """
    if not specs:
        return
    from gymnasium.envs.registration import registry

    for spec in specs:
        if spec.id not in registry:
            registry[spec.id] = spec
