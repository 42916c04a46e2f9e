"""The classic pipe-per-env ``SubprocVecEnv``: the design the field's vector envs started from.

One process per env, one duplex pipe per process; every step sends each worker its action
and receives a pickled ``(obs, reward, done, info)`` back, and a worker resets its env by
itself when the episode ends (the final observation goes in ``info["terminal_observation"]``).
Written here, in its plain form, as the baseline every engine is compared against; it keeps
the old four-tuple ``step`` API on purpose.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

__all__ = ["ClassicSubprocVecEnv"]


def _worker(conn: Any, parent_end: Any, fn_blob: bytes) -> None:
    import cloudpickle

    parent_end.close()  # only the parent keeps that end, so a dead parent gives us EOF
    env = cloudpickle.loads(fn_blob)()
    try:
        while True:
            cmd, data = conn.recv()
            if cmd == "step":
                obs, reward, terminated, truncated, info = env.step(data)
                done = terminated or truncated
                if done:
                    info = dict(info, terminal_observation=obs, **{"TimeLimit.truncated": truncated and not terminated})
                    obs, _ = env.reset()
                conn.send((obs, reward, done, info))
            elif cmd == "reset":
                obs, _ = env.reset(seed=data)
                conn.send(obs)
            elif cmd == "spaces":
                conn.send((env.observation_space, env.action_space))
            elif cmd == "close":
                break
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        env.close()
        conn.close()


def _stack(items: Sequence[Any]) -> Any:
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack([it[k] for it in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([it[i] for it in items]) for i in range(len(first)))
    return np.stack(items)


class ClassicSubprocVecEnv:
    """One process per env, results pickled through a pipe each step.

    Parameters
    ----------
    env_fns : sequence of callables
        Factories returning ``gymnasium.Env`` (cloudpickled, so lambdas work).
    context : str, optional
        ``multiprocessing`` start method; default ``"fork"`` where it exists (what the
        original used on Linux), else ``"spawn"``.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], context: str | None = None) -> None:
        import cloudpickle

        if context is None:
            context = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        # The stubs type get_context(str) as BaseContext, which lacks Process: it is one of these.
        ctx = cast("ForkContext | ForkServerContext | SpawnContext", mp.get_context(context))
        self.num_envs = len(env_fns)
        self.closed = False
        self.remotes: list[Any] = []
        self.procs: list[Any] = []
        try:
            for i, fn in enumerate(env_fns):
                remote, work = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker, args=(work, remote, cloudpickle.dumps(fn)), name=f"classic-subproc-{i}", daemon=True
                )
                proc.start()
                work.close()
                self.remotes.append(remote)
                self.procs.append(proc)
            self.remotes[0].send(("spaces", None))
            self.single_observation_space, self.single_action_space = self.remotes[0].recv()
        except BaseException:
            self.close()
            raise

    def reset(self, seed: int | None = None) -> Any:
        """Reset every env (env ``i`` with ``seed + i``) and return the stacked observations."""
        for i, remote in enumerate(self.remotes):
            remote.send(("reset", None if seed is None else seed + i))
        return _stack([remote.recv() for remote in self.remotes])

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, list[dict]]:
        """Step every env; ended episodes are reset in the worker. Returns ``obs, rewards, dones, infos``."""
        for remote, action in zip(self.remotes, actions):
            remote.send(("step", action))
        results = [remote.recv() for remote in self.remotes]
        obs, rewards, dones, infos = zip(*results)
        return _stack(obs), np.array(rewards, dtype=np.float64), np.array(dones, dtype=bool), list(infos)

    def close(self) -> None:
        """Ask every worker to stop, then make sure they have."""
        if self.closed:
            return
        self.closed = True
        for remote in self.remotes:
            try:
                remote.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=1)
        for remote in self.remotes:
            remote.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
