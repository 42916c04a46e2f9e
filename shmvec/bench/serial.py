"""The references: a plain Python loop over the raw envs, and the same loop split over processes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SerialLoop", "SplitSerial"]


class SerialLoop:
    """Step ``num_envs`` envs one after the other, resetting each when its episode ends.

    No batching, no copies, no processes: the least work any engine could do per env step on
    one core, so ``engine steps/s / serial steps/s`` says what an engine gains (or costs)
    over writing the loop yourself.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.envs = []
        try:
            for fn in env_fns:
                self.envs.append(fn())
        except BaseException:
            self.close()
            raise
        self.num_envs = len(self.envs)

    def reset(self, seed: int | None = None) -> list[Any]:
        """Reset every env (env ``i`` with ``seed + i``); returns the list of observations."""
        return [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.envs)]

    def step(self, actions: Any) -> None:
        """Step env ``i`` with ``actions[i]``; the results are dropped (a reference needs no more)."""
        for env, action in zip(self.envs, actions):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


class SplitSerial:
    """The envs split over ``k`` processes that each run a :class:`SerialLoop` on their block.

    Nothing passes between the processes while they step: each ``step`` call hands every
    process its block's actions and a number of steps (``steps_per_call``, calibrated at
    ``reset`` to about ``call_s`` seconds), and waits. That is the most any multi-process
    engine could make of this machine for this workload: where two vCPUs share a physical
    core, or the host is busy, it falls well short of ``k`` times the serial loop, whatever
    the engine.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], k: int, call_s: float = 0.03) -> None:
        import multiprocessing as mp

        import cloudpickle

        from shmvec.blocks import split

        self.blocks = split(len(env_fns), max(1, min(k, len(env_fns))))
        self.num_envs = len(env_fns)
        self.workers = len(self.blocks)
        self.steps_per_call = 1
        self.call_s = call_s
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        try:
            for b in self.blocks:
                parent, child = ctx.Pipe()
                blob = cloudpickle.dumps(list(env_fns[b.start : b.stop]))
                proc = ctx.Process(target=_serve_block, args=(child, blob), daemon=True, name="shmvec-bench-split")
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            self._gather()  # each block built its envs
        except BaseException:
            self.close()
            raise

    def _gather(self) -> list[Any]:
        replies = [conn.recv() for conn in self.conns]
        for reply in replies:
            if isinstance(reply, tuple) and reply and reply[0] == "error":
                raise RuntimeError(f"a block of SplitSerial failed: {reply[1]}")
        return replies

    def reset(self, seed: int | None = None) -> None:
        """Reset every env (env ``i`` with ``seed + i``), then calibrate ``steps_per_call``."""
        import time

        for conn, b in zip(self.conns, self.blocks):
            conn.send(("reset", None if seed is None else seed + b.start))
        self._gather()
        probe = 4
        start = time.perf_counter()
        self._run(None, probe)
        per_step = (time.perf_counter() - start) / probe
        self.steps_per_call = max(1, min(1024, round(self.call_s / max(per_step, 1e-7))))

    def step(self, actions: Any) -> None:
        """Every block steps ``steps_per_call`` times with its share of ``actions``."""
        self._run(actions, self.steps_per_call)

    def _run(self, actions: Any, steps: int) -> None:
        for conn, b in zip(self.conns, self.blocks):
            conn.send(("run", None if actions is None else actions[b.start : b.stop], steps))
        self._gather()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("close",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []


def _serve_block(conn: Any, blob: bytes) -> None:
    """A SplitSerial process: build its envs, then reset / run / close on command."""
    import cloudpickle

    loop = None
    try:
        loop = SerialLoop(cloudpickle.loads(blob))
        actions = [env.action_space.sample() for env in loop.envs]
        conn.send(None)
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                break
            if msg[0] == "reset":
                loop.reset(msg[1])
            elif msg[0] == "run":
                if msg[1] is not None:
                    actions = list(msg[1])
                for _ in range(msg[2]):
                    loop.step(actions)
            conn.send(None)
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        if loop is not None:
            loop.close()
