"""Torch tensors from a :class:`~shmvec.ShmVecEnv`: zero-copy on the CPU, pinned asynchronous
copies to a GPU.

>>> import torch, shmvec
>>> from shmvec.torch import TorchVecEnv
>>> envs = TorchVecEnv(shmvec.make("CartPole-v1", num_envs=4, num_workers=2), device="cpu")
>>> obs, infos = envs.reset(seed=0)
>>> obs.dtype, tuple(obs.shape)
(torch.float32, (4, 4))
>>> obs, rewards, terminations, truncations, infos = envs.step(torch.zeros(4, dtype=torch.int64))
>>> rewards
tensor([1., 1., 1., 1.], dtype=torch.float64)
>>> envs.close()

On a GPU the shared result buffers are registered as page-locked host memory
(``cudaHostRegister``), so every host-to-device copy is a DMA transfer that runs on a copy
stream of its own while the calling thread goes on. This module imports torch;
``import shmvec`` never does.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorWrapper

from shmvec.rollout_storage import split_policy_output
from shmvec.tree import assemble, flatten, pickled_fields
from shmvec.vector_env import ShmVecEnv

__all__ = ["TorchVecEnv"]

_PAGE = 4096


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor on ``array``'s memory. The result buffers are read-only views (users must not
    write them); torch warns about that once per tensor, and these tensors are only ever read.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


class _PinnedPages:
    """Host memory ranges registered with CUDA as page-locked, released together.

    Registration works on whole pages: the ranges of all arrays given are rounded out to pages
    and merged, so a page is never registered twice (CUDA refuses that).
    """

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def pin(self, arrays: list[np.ndarray]) -> bool:
        """Register the pages under ``arrays``; ``False`` (and a warning) where CUDA refuses."""
        spans = sorted(
            (a.ctypes.data // _PAGE * _PAGE, -(-(a.ctypes.data + a.nbytes) // _PAGE) * _PAGE)
            for a in arrays
            if a.nbytes
        )
        merged: list[list[int]] = []
        for start, stop in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        cudart = torch.cuda.cudart()
        for start, stop in merged:
            err = cudart.cudaHostRegister(start, stop - start, 1)  # portable: pinned for every device
            code = int(getattr(err, "value", err))
            if code != 0:
                warnings.warn(
                    f"shmvec.torch: cudaHostRegister refused {stop - start} bytes of shared memory "
                    f"(CUDA error {code}); copies to the GPU from it will not be asynchronous",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return False
            self.ranges.append((start, stop))
        return True

    def release(self) -> None:
        if not self.ranges:
            return
        torch.cuda.synchronize()  # no copy may still be reading these pages
        cudart = torch.cuda.cudart()
        for start, _ in self.ranges:
            cudart.cudaHostUnregister(start)
        self.ranges.clear()


def _close(env: ShmVecEnv, pins: list[_PinnedPages]) -> None:
    # Unregister before the shared memory is unmapped: pinned pages must not outlive their mapping.
    for p in pins:
        p.release()
    env.close()


class TorchVecEnv(VectorWrapper):
    """A :class:`~shmvec.ShmVecEnv` that takes and returns torch tensors on ``device``.

    ``reset``, ``step``, ``recv`` and ``rollout`` return tensors on ``device``; actions may be
    tensors on any device (or numpy arrays). Infos stay numpy, as the env gives them.

    - On the CPU the tensors share the shared-memory buffers (``torch.from_numpy``): no copy at
      all with ``copy=False``, one with ``copy=True``.
    - On a GPU the shared buffers are registered as page-locked memory once, and each batch goes
      to the device in asynchronous copies on a stream of this wrapper's. The returned tensors
      can be used at once on the current stream (it waits for the copy, the calling thread does
      not). Actions on the GPU come back through a pinned buffer.

    Example
    -------
    >>> import torch, shmvec
    >>> from shmvec.torch import TorchVecEnv
    >>> envs = TorchVecEnv(shmvec.make("CartPole-v1", num_envs=8, num_workers=2))  # cuda if there is one
    >>> obs, _ = envs.reset(seed=0)
    >>> batch = envs.rollout(lambda obs: (obs[:, 2] > 0).long(), num_steps=16)
    >>> tuple(batch["obs"].shape), batch["obs"].device == envs.device
    ((16, 8, 4), True)
    >>> envs.close()

    Parameters
    ----------
    env : ShmVecEnv
        The vector env; this wrapper owns it from now on (``close`` closes it) and reads its
        results from shared memory directly (it sets ``env.copy = False``).
    device : str or torch.device, optional
        Where results go; default ``"cuda"`` when torch sees a GPU, else ``"cpu"``.
    copy : bool, default True
        ``True``: every call returns new tensors. ``False``: the same tensors every call of a
        given batch size, overwritten by the next call (on the CPU: views of the shared buffers).
        Fixed addresses suit CUDA graphs; a copy then first waits for the work already queued
        on the current stream, which may still read the previous batch. On the CPU these are
        the env's shared result buffers, which torch cannot mark read-only (numpy's views are):
        an in-place change writes into them, so ``clone()`` a tensor before changing it.
    """

    env: ShmVecEnv  # VectorWrapper types it as any VectorEnv; __init__ accepts a ShmVecEnv only

    def __init__(self, env: ShmVecEnv, device: str | torch.device | None = None, copy: bool = True) -> None:
        if not isinstance(env, ShmVecEnv):
            raise TypeError(f"TorchVecEnv wraps a shmvec.ShmVecEnv, got {type(env).__name__}")
        pickled = pickled_fields(env.single_observation_space, env.single_action_space)
        if pickled:
            raise ValueError(
                f"TorchVecEnv cannot hold {', '.join(pickled)} in a tensor: its samples have no "
                "fixed size. Use the ShmVecEnv itself."
            )
        super().__init__(env)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"TorchVecEnv(device=...) must be a CPU or CUDA device, got {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # as the tensors will report it
        self.device = device
        self.copy = copy
        env.copy = False  # its own results are views: this wrapper copies once, straight to the device
        buffers = env.buffers
        obs_space = env.single_observation_space
        # The space each rollout field is nested as (None: a plain array).
        self._spaces = {
            "obs": obs_space,
            "final_obs": obs_space,
            "next_obs": obs_space,
            "actions": env.single_action_space,
        }
        self._host = [
            _host_tensor(a)
            for a in (*flatten(obs_space, buffers.obs), buffers.rewards, buffers.terminations, buffers.truncations)
        ]
        self._static: dict[tuple, list[torch.Tensor]] = {}  # copy=False: (what, size) -> device tensors
        self._runs: dict[bytes, tuple[tuple[int, int], ...]] = {}  # recv's env_ids -> contiguous runs
        self._staging: dict[tuple, torch.Tensor] = {}  # pinned buffers for actions coming from the GPU
        self._pins = [_PinnedPages(), _PinnedPages()]  # the result buffers; the rollout storage
        self._rollout_key: tuple | None = None  # the rollout storage now pinned: (num_steps, address)
        self._rollout_static: dict[int, dict[str, Any]] = {}
        self._pending = False  # a copy from shared memory may still be running
        self.pinned = False
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                self._stream = torch.cuda.Stream(self.device)
                self._copied = torch.cuda.Event()
            self.pinned = self._pins[0].pin(
                [*flatten(obs_space, buffers.obs), buffers.rewards, buffers.terminations, buffers.truncations]
            )
        self._finalizer = weakref.finalize(self, _close, env, self._pins)

    def __getattr__(self, name: str) -> Any:
        # The env's own attributes (episode_returns, restarts, batch_size, ...); never private ones.
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    # -- the VectorEnv API ----------------------------------------------------------------
    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset as :meth:`ShmVecEnv.reset`; the observations as tensors on :attr:`device`."""
        self._wait_for_copies()
        _, infos = self.env.reset(seed=seed, options=options)
        obs = self._to_device(self._host[:-3], ((0, self.num_envs),), "reset")
        return assemble(self.single_observation_space, obs), infos

    def step(self, actions: Any) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step as :meth:`ShmVecEnv.step`, with ``actions`` a tensor (any device) or an array."""
        actions = self._host_actions(actions)
        self._wait_for_copies()
        infos = self.env.step(actions)[4]
        *obs, rewards, terms, truncs = self._to_device(self._host, ((0, self.num_envs),), "step")
        return assemble(self.single_observation_space, obs), rewards, terms, truncs, infos

    def async_reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting every env; :meth:`recv` returns the batches (:meth:`ShmVecEnv.async_reset`)."""
        self._wait_for_copies()
        self.env.async_reset(seed=seed, options=options)

    def send(self, actions: Any, env_ids: Any) -> None:
        """Step the envs ``env_ids`` (the ids :meth:`recv` returned) with ``actions``."""
        actions = self._host_actions(actions)
        self._wait_for_copies()
        self.env.send(actions, env_ids)

    def recv(self) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any], np.ndarray]:
        """The next ready batch, as :meth:`ShmVecEnv.recv` returns it, with tensors on :attr:`device`.

        ``env_ids`` stays the read-only numpy array the env gave: pass it back to :meth:`send`.
        """
        infos, env_ids = self.env.recv()[4:]
        runs = self._runs.get(env_ids.tobytes())
        if runs is None:
            splits = np.flatnonzero(np.diff(env_ids) != 1) + 1
            runs = self._runs[env_ids.tobytes()] = tuple(
                (int(part[0]), int(part[-1]) + 1) for part in np.split(env_ids, splits)
            )
        *obs, rewards, terms, truncs = self._to_device(self._host, runs, "recv")
        return assemble(self.single_observation_space, obs), rewards, terms, truncs, infos, env_ids

    def rollout(self, policy: Callable[[Any], Any], num_steps: int) -> dict[str, Any]:
        """:meth:`ShmVecEnv.rollout` with a torch policy; the ``[T, N]`` batch as tensors on :attr:`device`.

        ``policy(obs)`` gets each step's observations on :attr:`device` and returns actions (a
        tensor, any device) or ``(actions, extras)`` with ``extras`` a dict of ``[N, ...]``
        tensors, kept per step where the policy made them (``[T, N, ...]``). On a GPU each
        row of observations is copied to the device as the policy needs it, into the batch's
        ``obs``; the rest of the batch follows in one round of copies at the end. The batch is
        overwritten by the next ``rollout`` of the same length (clone what you keep).
        """
        self._wait_for_copies()
        storage = self._rollout_static.setdefault(num_steps, {})
        gpu = self.device.type == "cuda"
        extras: dict[str, torch.Tensor] = {}

        step = [0]

        def host_policy(obs_row: Any) -> Any:
            t = step[0]
            step[0] += 1
            rows = [_host_tensor(a) for a in flatten(self.single_observation_space, obs_row)]
            if gpu:
                if "obs" not in storage:
                    storage["obs"] = [
                        torch.empty((num_steps, *r.shape), dtype=r.dtype, device=self.device) for r in rows
                    ]
                for dst, src in zip(storage["obs"], rows):
                    dst[t].copy_(src, non_blocking=True)
                rows = [dst[t] for dst in storage["obs"]]
            actions, more = split_policy_output(
                policy(assemble(self.single_observation_space, rows)), self.single_action_space
            )
            for key, value in more.items():
                value = torch.as_tensor(value)
                if key not in extras:
                    extras[key] = torch.empty((num_steps, *value.shape), dtype=value.dtype, device=value.device)
                extras[key][t] = value
            return self._host_actions(actions)

        key = self._rollout_key
        if key is not None and key[0] != num_steps:
            self._pins[1].release()  # the env frees that storage for one of the new length
            self._rollout_key = None
        batch = self.env.rollout(host_policy, num_steps)
        out: dict[str, Any] = {"infos": batch["infos"]}
        names = [
            k
            for k in ("obs", "actions", "rewards", "terminations", "truncations", "valid", "final_obs", "next_obs")
            if k in batch
        ]
        if gpu:
            if self._rollout_key is None:
                # The shared rollout segment only (``valid`` is the parent's own small array).
                self._pins[1].pin([a for name in names if name != "valid" for a in self._leaves(name, batch[name])])
                self._rollout_key = (num_steps, batch["rewards"].ctypes.data)
            for name in names:
                if name == "obs":
                    out[name] = assemble(self._spaces["obs"], storage["obs"])
                    continue
                host = [_host_tensor(a) for a in self._leaves(name, batch[name])]
                if name not in storage:
                    storage[name] = [torch.empty(h.shape, dtype=h.dtype, device=self.device) for h in host]
                for dst, src in zip(storage[name], host):
                    dst.copy_(src, non_blocking=True)
                out[name] = assemble(self._spaces.get(name), storage[name])
            self._copied.record(torch.cuda.current_stream(self.device))
            self._pending = True
        else:
            for name in names:
                out[name] = assemble(self._spaces.get(name), [_host_tensor(a) for a in self._leaves(name, batch[name])])
        out.update(extras)
        return out

    def close(self, **kwargs: Any) -> None:
        """Release the pinned pages, then close the env (workers, envs, shared memory)."""
        self._finalizer()

    def __enter__(self) -> TorchVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------
    def _wait_for_copies(self) -> None:
        """Before the envs write shared memory again, the copies out of it must have run."""
        if self._pending:
            self._copied.synchronize()
            self._pending = False

    def _to_device(self, host: list[torch.Tensor], runs: tuple[tuple[int, int], ...], what: str) -> list[torch.Tensor]:
        """Rows ``runs`` (``(start, stop)`` env ranges, in order) of each host tensor, on the device."""
        size = sum(stop - start for start, stop in runs)
        if self.device.type == "cpu":
            if len(runs) == 1:
                start, stop = runs[0]
                return [h[start:stop].clone() if self.copy else h[start:stop] for h in host]
            return [torch.cat([h[start:stop] for start, stop in runs]) for h in host]
        current = torch.cuda.current_stream(self.device)
        stream = self._stream
        out: list[torch.Tensor] | None
        if self.copy:
            with torch.cuda.stream(stream):
                out = [torch.empty((size, *h.shape[1:]), dtype=h.dtype, device=self.device) for h in host]
        else:
            out = self._static.get((what, size))
            if out is None:
                out = self._static[(what, size)] = [
                    torch.empty((size, *h.shape[1:]), dtype=h.dtype, device=self.device) for h in host
                ]
            stream.wait_stream(current)  # kernels queued before may still read the last batch
        with torch.cuda.stream(stream):
            for dst, src in zip(out, host):
                pos = 0
                for start, stop in runs:
                    dst[pos : pos + stop - start].copy_(src[start:stop], non_blocking=True)
                    pos += stop - start
            self._copied.record(stream)
        current.wait_event(self._copied)
        if self.copy:
            for t in out:
                t.record_stream(current)  # made on the copy stream, used on the current one
        self._pending = True
        return out

    def _leaves(self, name: str, value: Any) -> list[Any]:
        """The arrays of rollout field ``name`` (nested as its space, or one plain array)."""
        return flatten(self._spaces.get(name), value)

    def _host_actions(self, actions: Any) -> Any:
        """``actions`` as numpy: CPU tensors by view, GPU tensors through pinned staging buffers."""
        leaves = flatten(self.single_action_space, actions)
        if not any(isinstance(a, torch.Tensor) for a in leaves):
            return actions
        waited: list[torch.device] = []
        out = []
        for i, a in enumerate(leaves):
            if isinstance(a, torch.Tensor):
                a = a.detach()
                if a.device.type == "cuda":
                    key = (i, tuple(a.shape), a.dtype)
                    staging = self._staging.get(key)
                    if staging is None:
                        staging = self._staging[key] = torch.empty(a.shape, dtype=a.dtype, pin_memory=True)
                    staging.copy_(a, non_blocking=True)
                    if a.device not in waited:
                        waited.append(a.device)
                    a = staging
                a = a.numpy()
            out.append(a)
        for device in waited:
            torch.cuda.current_stream(device).synchronize()
        return assemble(self.single_action_space, out)
