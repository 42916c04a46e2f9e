"""Capturing and restoring the state of one env, in the process that steps it.

An env is a stack of layers, its wrappers outermost first, the base env last. A snapshot holds
the state of each layer, taken in one of three ways:

- a layer whose class defines ``get_state()`` and ``set_state(state)`` gives its own state, which
  stands for that layer and every layer under it (the walk stops there);
- any other layer gives its attributes (``__dict__``), all layers pickled in one pass, so that
  an object two layers share stays shared after a restore. Inside that pass the layers
  themselves (a wrapper's ``env``) and the live handles of native libraries are not pickled:
  they stay the objects of the env restored into;
- of those native handles, the ones that hold the simulation carry their own state: ALE's
  emulator (``cloneState(include_rng=True)``, sticky-action RNG included) and MuJoCo's
  ``MjData`` (a full copy, restored with ``mj_copyData``: a step reads quantities that the
  previous step derived, so the integration state alone would not continue bit for bit).
  Other handles (MuJoCo's model, renderers, pygame surfaces) are kept as they are, and so are
  a layer's spaces, but for their random generators: the bounds of an image space would
  otherwise be most of a snapshot.

What a layer holds outside itself (a module-level RNG, a file) is not part of its state.

Only the standard library is imported at module level: a spawned worker imports this module
before it sets the thread-count variables of BLAS/OpenMP.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["capture", "restore", "layer_names"]

# Native handles, by (module prefix, class name): what they are to a snapshot. "state": the
# handle's own state travels (see _save_native); "live": kept as it is.
_ALE, _MJDATA, _SPACE, _LIVE = "ale", "mjdata", "space", "live"


_KINDS: dict[type, str | None] = {}  # what _native says of each type, once per type (pickling asks per object)


def _native(obj: Any) -> str | None:
    cls = type(obj)
    try:
        return _KINDS[cls]
    except KeyError:
        kind = _KINDS[cls] = _kind_of(cls)
        return kind


def _kind_of(cls: type) -> str | None:
    from gymnasium.spaces import Space

    if issubclass(cls, Space):  # its bounds are arrays the size of an observation: only its RNGs travel
        return _SPACE
    module = cls.__module__ or ""
    if module.startswith("ale_py"):
        return _ALE if cls.__name__ == "ALEInterface" else None
    if module.startswith("mujoco"):  # MjModel, the MjvScene and MjrContext of a renderer, ...
        if cls.__name__ == "MjData":
            return _MJDATA
        return _LIVE if cls.__name__.startswith("Mj") else None
    if module.startswith(("pygame", "gymnasium.envs.mujoco.mujoco_rendering")):
        return _LIVE
    return None


def _error(env_index: int, env: Any, why: str) -> Exception:
    from shmvec.errors import SnapshotError

    return SnapshotError(f"env {env_index} ({_describe(env)}) {why}")


def _describe(env: Any) -> str:
    spec = getattr(env, "spec", None)
    name = getattr(spec, "id", None) or type(env).__name__
    return f"{name}: {' > '.join(layer_names(env))}"


def _stack(env: Any) -> list:
    """The layers of ``env``, outermost first, down to the base env or the first layer with a
    state protocol of its own.
    """
    import gymnasium as gym

    layers = [env]
    while not _has_protocol(layers[-1]) and isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _has_protocol(layer: Any) -> bool:
    cls = type(layer)
    return callable(getattr(cls, "get_state", None)) and callable(getattr(cls, "set_state", None))


def layer_names(env: Any) -> list[str]:
    """The class names of ``env``'s layers, outermost first (what a snapshot must be restored into)."""
    return [type(layer).__name__ for layer in _stack(env)]


class _Pickler(pickle.Pickler):
    """Pickles layers' attributes; the layers and the native handles become references."""

    def __init__(self, file: Any, refs: dict[int, tuple]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.refs = refs

    def persistent_id(self, obj: Any) -> tuple | None:
        ref = self.refs.get(id(obj))
        if ref is not None:
            return ref
        kind = _native(obj)
        if kind is not None and kind != _SPACE:  # a space inside a container: pickled whole
            raise pickle.PicklingError(
                f"a {type(obj).__module__}.{type(obj).__name__} nested inside another attribute "
                "(a snapshot restores native handles only where a layer holds them directly)"
            )
        return None


def _dump(payload: Any, refs: dict[int, tuple]) -> bytes:
    buf = io.BytesIO()
    try:
        _Pickler(buf, refs).dump(payload)
    except (pickle.PicklingError, TypeError, AttributeError):
        # Lambdas and local classes (a TransformObservation's function, say): by value.
        import cloudpickle

        class _CloudPickler(cloudpickle.Pickler):
            persistent_id = _Pickler.persistent_id

        buf = io.BytesIO()
        pickler = _CloudPickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.refs = refs
        pickler.dump(payload)
    return buf.getvalue()


def _find_culprit(layers: list, refs: dict[int, tuple]) -> str:
    """Which attribute of which layer cannot be pickled, for the error message."""
    for layer in layers:
        if _has_protocol(layer):
            continue
        for name, value in vars(layer).items():
            if id(value) in refs:
                continue
            try:
                _dump(value, refs)
            except Exception as exc:
                what = f"{type(layer).__name__} ({type(value).__name__})"
                return f"attribute {name!r} of {what}: {type(exc).__name__}: {exc}"
    return "no single attribute: the layers together"


def capture(env: Any, env_index: int) -> bytes:
    """The state of ``env`` (env ``env_index`` of its vector env, for errors) as bytes."""
    layers = _stack(env)
    own = layers[-1] if _has_protocol(layers[-1]) else None
    plain = layers[:-1] if own is not None else layers
    refs: dict[int, tuple] = {id(layer): ("layer", i) for i, layer in enumerate(layers)}
    natives: dict[tuple[int, str], tuple[str, Any]] = {}
    for i, layer in enumerate(plain):
        for name, value in vars(layer).items():
            kind = _native(value)
            if kind is not None:
                refs[id(value)] = ("native", i, name)
                if kind != _LIVE:
                    natives[(i, name)] = (kind, _save_native(kind, value))
    try:
        state = _dump([vars(layer) for layer in plain], refs)
        own_state = own.get_state() if own is not None else None
        blob = pickle.dumps((layer_names(env), state, natives, own_state), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        if own is not None and _is_from(exc, own):
            why = f"cannot be snapshotted: {type(own).__name__}.get_state() raised {exc!r}"
            raise _error(env_index, env, why) from exc
        raise _error(
            env_index,
            env,
            f"cannot be snapshotted: {_find_culprit(layers, refs)}. Give the env (or a wrapper) "
            "get_state() and set_state(state) methods to say what its state is",
        ) from exc
    return blob


def _is_from(exc: BaseException, obj: Any) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_locals.get("self") is obj:
            return True
        tb = tb.tb_next
    return False


def _save_native(kind: str, handle: Any) -> Any:
    if kind == _ALE:
        return handle.cloneState(include_rng=True)
    if kind == _SPACE:
        return [space._np_random for space in _subspaces(handle)]  # Generators pickle by value
    import copy

    return copy.copy(handle)  # MjData: a full copy (mj_copyData)


def _subspaces(space: Any) -> list:
    """``space`` and the spaces inside it (a Dict's, a Tuple's, ...), depth first: each has its own RNG."""
    from gymnasium.spaces import Space

    out = [space]
    for value in vars(space).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, Space):
                out += _subspaces(item)
    return out


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, layers: list) -> None:
        super().__init__(file)
        self.layers = layers

    def persistent_load(self, ref: tuple) -> Any:
        if ref[0] == "layer":
            return self.layers[ref[1]]
        _, i, name = ref
        return vars(self.layers[i])[name]


def restore(env: Any, blob: bytes, env_index: int) -> None:
    """Put ``env`` (env ``env_index``, for errors) back in the state that :func:`capture` saved in ``blob``."""
    names, state, natives, own_state = pickle.loads(blob)
    layers = _stack(env)
    if layer_names(env) != names:
        raise _error(env_index, env, f"cannot take a snapshot of an env made of other layers ({' > '.join(names)})")
    own = layers[-1] if _has_protocol(layers[-1]) else None
    plain = layers[:-1] if own is not None else layers
    for i, layer in enumerate(plain):  # every native handle the snapshot refers to must be here too
        for (j, name), (kind, _) in natives.items():
            if j == i and _native(vars(layer).get(name)) != kind:
                raise _error(env_index, env, f"has no {kind} handle in attribute {name!r} of {type(layer).__name__}")
    attrs = _Unpickler(io.BytesIO(state), layers).load()
    for layer, saved in zip(plain, attrs):
        live = vars(layer)
        live.clear()
        live.update(saved)
    for (i, name), (kind, saved) in natives.items():
        handle = vars(plain[i])[name]
        if kind == _ALE:
            handle.restoreState(saved)
        elif kind == _SPACE:
            spaces = _subspaces(handle)
            if len(spaces) != len(saved):
                raise _error(env_index, env, f"has another space in {name!r} of {type(plain[i]).__name__}")
            for space, rng in zip(spaces, saved):
                space._np_random = rng
        else:
            import mujoco

            model = next((v for v in vars(plain[i]).values() if type(v).__name__ == "MjModel"), None)
            if model is None:
                raise _error(env_index, env, f"holds MjData in {name!r} but no MjModel beside it")
            mujoco.mj_copyData(handle, model, saved)
    if own is not None:
        own.set_state(own_state)
