"""What the drop-in adapters (:mod:`shmvec.sb3`, :mod:`shmvec.baselines`) share.

* :func:`list_infos` turns Gymnasium's dict-of-arrays infos of a SAME_STEP step into the
  classic list of one dict per env (``terminal_observation``, ``TimeLimit.truncated``).
* :class:`EnvSide` is the outermost wrapper the SB3 adapter puts around each env, so that
  per-env requests (``get_attr`` with ``indices``, ``env_is_wrapped``, ...) run against the
  user's env exactly as SB3's own workers run them.
* :func:`env_indices` reads the ``indices=`` argument of those requests.
* :func:`batched_actions` turns the classic per-env list of actions into Gymnasium's batch.

Nothing here imports SB3 or torch: :class:`EnvSide` is unpickled in every worker process, and
a worker started with ``spawn``/``forkserver`` should not pay for importing them.
"""

from __future__ import annotations

import functools
import operator
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsIndex, cast

import gymnasium as gym
import numpy as np

__all__ = ["EnvSide", "EnvSideFactory", "Failure", "batched_actions", "env_indices", "env_info", "list_infos"]

# Gymnasium batches a Python bool/int/float info value into a bool/int64/float64 array; an
# element of those is given back as the Python object the env most likely returned.
_PYTHON_DTYPES = frozenset({np.dtype(np.bool_), np.dtype(np.int64), np.dtype(np.float64)})
# Keys of a SAME_STEP step's infos that describe the episode that ended, not the new one.
_FINAL_KEYS = frozenset({"final_obs", "_final_obs", "final_info", "_final_info"})


def env_info(batched: dict[str, Any], i: int, skip: frozenset = frozenset()) -> dict[str, Any]:
    """The info dict of env ``i`` out of Gymnasium's dict-of-arrays ``batched`` infos.

    A key is data when its mask ``"_" + key`` is present; it belongs to env ``i`` when the
    mask is set there. Nested dicts are unbatched recursively. Elements of the bool / int64 /
    float64 arrays that Gymnasium makes of Python scalars come back as Python scalars; other
    elements (numpy scalars of other dtypes, array rows, objects) as they are stored.
    """
    out: dict[str, Any] = {}
    for key, value in batched.items():
        if key in skip:
            continue
        mask = batched.get("_" + key) if type(key) is str else None
        if mask is None or not mask[i]:
            continue
        if isinstance(value, dict):
            out[key] = env_info(value, i)
        elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype in _PYTHON_DTYPES:
            out[key] = value[i].item()
        else:
            out[key] = value[i]
    return out


def list_infos(
    infos: dict[str, Any],
    terminated: np.ndarray,
    truncated: np.ndarray,
    reset_infos: list[dict[str, Any]] | None = None,
    time_limit_always: bool = True,
) -> list[dict[str, Any]]:
    """SB3 / baselines infos (one dict per env) from a SAME_STEP step's dict-of-arrays infos.

    For an env whose episode ended (``terminated | truncated``), its dict is the info of the
    episode's last step plus ``"terminal_observation"`` (the final observation) and
    ``"TimeLimit.truncated"`` (``truncated and not terminated``); the info of the reset that
    followed goes to ``reset_infos[i]`` when that list is given. For the other envs it is the
    step's info, with ``"TimeLimit.truncated": False`` when ``time_limit_always`` (SB3 puts the
    key in every info; the classic baselines only at episode ends).

    Parameters
    ----------
    infos : dict
        What ``ShmVecEnv.step`` returned, under ``AutoresetMode.SAME_STEP``.
    terminated, truncated : ndarray of bool, shape [N]
        The step's flags.
    reset_infos : list of dict, optional
        Updated in place at the envs that were reset.
    time_limit_always : bool, default True
        Put ``"TimeLimit.truncated"`` in the info of every env, not only where an episode ended.

    Returns
    -------
    list of dict
        ``N`` new dicts, which the caller may change.
    """
    n = terminated.shape[0]
    if not infos:
        # The common step: no env reported anything and no episode ended (under SAME_STEP an
        # ended episode always brings final_obs), so only the fixed key remains.
        if time_limit_always:
            return [{"TimeLimit.truncated": False} for _ in range(n)]
        return [{} for _ in range(n)]
    dones = terminated | truncated
    final_obs = infos.get("final_obs")
    has_final = infos.get("_final_obs")
    final_info = infos.get("final_info")
    has_final_info = infos.get("_final_info")
    restarted = infos.get("_restarted")
    out = []
    for i in range(n):
        if not dones[i]:
            info = env_info(infos, i, _FINAL_KEYS)
            if time_limit_always:
                info["TimeLimit.truncated"] = False
            out.append(info)
            continue
        # The top-level entries of an ended env belong to the reset that followed.
        reset_info = env_info(infos, i, _FINAL_KEYS)
        info = {}
        if final_info is not None:
            assert has_final_info is not None  # Gymnasium sets the mask "_final_info" with "final_info"
            if has_final_info[i]:
                info = env_info(final_info, i)
        if restarted is not None and restarted[i]:
            # ShmVecEnv(on_error="restart") replaced this env: flag it where users look.
            info["restarted"] = reset_info.pop("restarted", True)
        if reset_infos is not None:
            reset_infos[i] = reset_info
        info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        if final_obs is not None:
            assert has_final is not None  # Gymnasium sets the mask "_final_obs" with "final_obs"
            if has_final[i]:
                info["terminal_observation"] = final_obs[i]
        out.append(info)
    return out


def env_indices(indices: None | int | slice | Iterable[int], num_envs: int) -> list[int]:
    """The env indices, each in ``0..num_envs-1``, that an ``indices=`` argument refers to.

    As SB3's ``VecEnv`` reads it: ``None`` is every env, an int is one env, any other iterable
    of ints lists envs in order (repeats allowed). Each index is read as a Python list index
    would be: a negative one counts from the end, numpy integers are fine. A ``slice`` selects
    as it does on a list (SB3 itself does not take slices).

    Raises
    ------
    IndexError
        An index outside ``-num_envs..num_envs-1``.
    TypeError
        Something that is not an int (a float, a string) where an index should be.
    """
    if indices is None:
        return list(range(num_envs))
    if isinstance(indices, slice):
        return list(range(num_envs))[indices]
    # operator.index takes exactly what a list index takes (int, numpy integer, 0-d int array);
    # what it refuses is read as an iterable of indices (the casts name what each branch tries).
    try:
        wanted = [operator.index(cast(SupportsIndex, indices))]
    except TypeError:
        wanted = [operator.index(i) for i in cast(Iterable[int], indices)]
    out = []
    for i in wanted:
        if not -num_envs <= i < num_envs:
            raise IndexError(f"env index {i} is out of range for {num_envs} envs")
        out.append(i % num_envs)
    return out


def batched_actions(space: gym.Space, actions: Any, num_envs: int) -> Any:
    """Gymnasium's batch of ``actions`` for a Dict/Tuple ``space`` given one sample per env.

    SB3 and the classic baselines index actions per env (``actions[i]`` is env ``i``'s), so
    for a nested space they come as a list of ``num_envs`` dicts or tuples (or a tuple of
    dicts); a ShmVecEnv takes a dict (tuple) of ``[num_envs, ...]`` arrays. Anything else
    (arrays for flat spaces, an already batched dict or tuple) is returned as it is.
    """
    if (
        not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
        or not isinstance(actions, (list, tuple))
        or len(actions) != num_envs
    ):
        return actions
    # A tuple is already a batch for a Tuple space (one array per subspace), however many
    # subspaces it has: only a list, or for a Dict space a tuple of dicts, is one sample per env.
    if isinstance(actions, tuple) and not (
        isinstance(space, gym.spaces.Dict) and all(isinstance(a, dict) for a in actions)
    ):
        return actions
    from gymnasium.vector.utils import concatenate, create_empty_array

    try:
        out = create_empty_array(space, num_envs)
        assert out is not None  # a dict (tuple) for a Dict (Tuple) space: None is for custom spaces only
        return concatenate(space, actions, out)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"actions: expected one sample of {space} per env: {type(exc).__name__}: {exc}") from None


# -- the env side of the SB3 adapter --------------------------------------------------------


class Failure:
    """An exception raised by an env during a per-env request, carried back to the caller."""

    def __init__(self, exc: BaseException) -> None:
        self.remote_traceback = "".join(traceback.format_exception(exc))
        try:
            import pickle

            pickle.dumps(exc)
            self.exc: BaseException = exc
        except Exception:  # an exception that cannot travel: keep its type name and message
            self.exc = RuntimeError(f"{type(exc).__name__}: {exc}")

    def reraise(self, env_index: int) -> None:
        """Raise the env's exception here, with where it came from as a note."""
        exc = self.exc
        exc.add_note(f"(raised by env {env_index}; its traceback:)\n{self.remote_traceback}")
        raise exc


class EnvSide(gym.Wrapper):
    """The outermost wrapper of each env of :class:`shmvec.sb3.SubprocVecEnv`.

    It changes nothing in ``step``/``reset``/``render``; it knows its env's index, so one
    ``ShmVecEnv.call`` can carry a request for any subset of envs (SB3's ``indices=``) and
    run it against the user's env (``self.env``) exactly as SB3's workers do: attributes via
    ``get_wrapper_attr``, ``set_attr`` as a plain ``setattr`` on the outermost user env,
    ``env_is_wrapped`` by walking the wrapper chain with ``isinstance``.
    """

    def __init__(self, env: gym.Env, index: int) -> None:
        super().__init__(env)
        self.shmvec_index = index

    def shmvec_request(self, targets: Sequence[int], op: str, args: tuple) -> list[Any] | None:
        """Run ``op`` once per occurrence of this env in ``targets``; ``None`` if not targeted.

        An exception is returned as a :class:`Failure` (the vector env stays usable and the
        caller re-raises it), never raised.
        """
        count = sum(1 for t in targets if t == self.shmvec_index)
        if not count:
            return None
        results = []
        for _ in range(count):
            try:
                results.append(self._run(op, args))
            except Exception as exc:
                results.append(Failure(exc))
        return results

    def _run(self, op: str, args: tuple) -> Any:
        # The env a request reaches: the user's, or the one it holds for shmvec (an AgentRows
        # holds a PettingZoo env, which has no wrapper chain of Gymnasium's).
        env = getattr(self.env, "shmvec_target", self.env)
        attr = env.get_wrapper_attr if isinstance(env, gym.Env) else functools.partial(getattr, env)
        if op == "get_attr":
            return attr(args[0])
        if op == "has_attr":
            try:
                attr(args[0])
                return True
            except AttributeError:
                return False
        if op == "set_attr":
            setattr(env, args[0], args[1])
            return None
        if op == "env_method":
            name, method_args, method_kwargs = args
            return attr(name)(*method_args, **method_kwargs)
        if op == "is_wrapped":
            wrapper_class = args[0]
            while isinstance(env, gym.Wrapper):
                if isinstance(env, wrapper_class):
                    return True
                env = env.env
            return False
        raise ValueError(f"unknown request {op!r}")


class EnvSideFactory:
    """A picklable env factory: the user's factory, wrapped by :class:`EnvSide`."""

    def __init__(self, env_fn: Callable[[], Any], index: int) -> None:
        self.env_fn, self.index = env_fn, index

    def __call__(self) -> EnvSide:
        env = self.env_fn()
        if not isinstance(env, gym.Env):
            # An OpenAI Gym env: SB3 converts it through shimmy; so do we, in that rare case.
            from stable_baselines3.common.vec_env.patch_gym import _patch_env

            env = _patch_env(env)
        return EnvSide(env, self.index)
