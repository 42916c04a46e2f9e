"""The worker processes of a pool: start, handshake, restart, shutdown.

Worker ``lane`` is the process that serves lane ``lane`` (the lanes served by workers come
first; the calling process's lane, if any, is the last). This module owns the processes and
their pipes; what runs over the shared segment, one command round at a time, is ``pool``'s.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import Any

from shmvec import protocol as P
from shmvec.errors import StepTimeout, WorkerDied, WorkerError
from shmvec.worker import worker_main

# Seconds between looks at a worker's liveness while waiting for a message on its pipe.
POLL_S = 0.5


def raise_construct_failure(msg: Any, first_env: int) -> None:
    """Raise what a lane's construction reported, if it failed: :class:`WorkerError` for a
    :class:`~shmvec.protocol.ConstructError`, ``ValueError`` for a :class:`~shmvec.protocol.Mismatch`.
    """
    if isinstance(msg, P.ConstructError):
        raise WorkerError(msg.report)
    if isinstance(msg, P.Mismatch):
        raise ValueError(f"env {msg.env_index} has spaces {msg.spaces} that differ from those of env {first_env}")


class WorkerProcesses:
    """One worker process per lane in ``lane_envs``, each building and stepping that lane's envs.

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
        Every env's factory; worker ``lane`` gets ``env_fns[lane_envs[lane]]``, pickled here.
    lane_envs : list of range
        The envs of each lane served by a worker.
    context : str or None
        ``multiprocessing`` start method (``"fork"``, ``"forkserver"``, ``"spawn"``).

    Raises
    ------
    TypeError
        If a lane's factories cannot be pickled (nothing is started then).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], lane_envs: list[range], context: str | None) -> None:
        import cloudpickle

        self._blobs: list[bytes] = []
        for envs in lane_envs:
            try:
                self._blobs.append(cloudpickle.dumps(list(env_fns[envs.start : envs.stop])))
            except Exception as exc:
                raise TypeError(f"env_fns[{envs.start}:{envs.stop}] cannot be pickled for the workers: {exc}") from exc
        self._ctx = mp.get_context(context)
        self.context: str = self._ctx.get_start_method()
        self.lane_envs = lane_envs
        count = len(lane_envs)
        self.procs: list[Any] = [None] * count  # multiprocessing.Process, once started
        self.conns: list[Any] = [None] * count  # each worker's duplex pipe (handshake, payloads, replies)
        self.wake_fds: list[int] = [-1] * count  # write end of each worker's wake pipe
        self._wake_conns: list[Any] = [None] * count
        done_r, done_w = self._ctx.Pipe(duplex=False)
        self._done_conns = (done_r, done_w)  # done_w stays open: restarted workers get it too
        self.done_fd: int = done_r.fileno()  # read end of the pipe every worker rings when done
        os.set_blocking(self.done_fd, False)
        os.set_blocking(done_w.fileno(), False)

    # -- start-up ------------------------------------------------------------------------------
    def start(self, lane: int) -> None:
        """Start (or restart) the worker process of ``lane``."""
        ctx = self._ctx
        parent_conn, child_conn = ctx.Pipe()
        wake_r, wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(wake_r.fileno(), False)
        os.set_blocking(wake_w.fileno(), False)
        proc = ctx.Process(
            target=worker_main,
            args=(lane, self.lane_envs[lane].start, self._blobs[lane], child_conn, wake_r, self._done_conns[1]),
            name=f"shmvec-worker-{lane}",
            daemon=True,
        )
        proc.start()
        child_conn.close()
        wake_r.close()
        self.procs[lane], self.conns[lane] = proc, parent_conn
        self._wake_conns[lane], self.wake_fds[lane] = wake_w, wake_w.fileno()

    def spaces(self, lane: int, deadline: float | None) -> P.Spaces:
        """The spaces (and metadata) that the envs of ``lane`` reported once built.

        Raises :class:`WorkerError` if building an env raised, ``ValueError`` if the lane's
        envs disagree, :class:`WorkerDied` or :class:`StepTimeout` if the worker is lost.
        """
        msg = self.recv(lane, deadline, "construct")
        raise_construct_failure(msg, self.lane_envs[lane].start)
        return msg

    def attach(self, lane: int, attach: P.Attach, fd: int) -> None:
        """Hand worker ``lane`` the segment (``fd``) and how to use it (``attach``)."""
        from multiprocessing.reduction import send_handle

        self.conns[lane].send(attach)
        send_handle(self.conns[lane], fd, self.procs[lane].pid)

    def ready(self, lane: int, deadline: float | None) -> None:
        """Wait for worker ``lane`` to confirm that it mapped the segment."""
        msg = self.recv(lane, deadline, "attach")
        if not isinstance(msg, P.Ready):
            raise RuntimeError(f"worker {lane} answered {msg!r} to attach")

    # -- messages --------------------------------------------------------------------------------
    def send(self, lane: int, payload: bytes, fd: int | None = None) -> None:
        """Send a command's pickled payload (and a descriptor after it) to worker ``lane``.

        A worker that died since its last command (the OOM killer strikes any time) is passed
        over: the other lanes must still get their payloads, or they would wait for them
        forever, and the round's wait reports this one as :class:`WorkerDied` (its sentinel is
        ready and its DONE never comes).
        """
        try:
            self.conns[lane].send_bytes(payload)  # the worker's conn.recv() unpickles it
            if fd is not None:
                from multiprocessing.reduction import send_handle

                send_handle(self.conns[lane], fd, self.procs[lane].pid)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def recv(self, lane: int, deadline: float | None, phase: str) -> Any:
        """Receive one message from worker ``lane``, watching its liveness and ``deadline``."""
        conn, proc = self.conns[lane], self.procs[lane]
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                if proc.is_alive():
                    proc.kill()
                raise StepTimeout(f"worker {lane} did not answer during {phase} within the timeout; it was stopped")
            ready = mp_wait([conn, proc.sentinel], wait)
            if conn in ready:
                try:
                    return conn.recv()
                except EOFError:
                    pass
            if proc.sentinel in ready or not proc.is_alive():
                raise self.died(lane)

    # -- faults ------------------------------------------------------------------------------------
    def died(self, lane: int) -> WorkerDied:
        """Reap worker ``lane``, which exited; the failure to report."""
        proc = self.procs[lane]
        proc.join(1.0)
        return WorkerDied(lane, proc.exitcode, self.lane_envs[lane])

    def stop_overdue(self, lane: int, timeout: float) -> StepTimeout:
        """Kill worker ``lane``, which overran ``timeout``; the failure to report."""
        self.procs[lane].kill()
        self.procs[lane].join(1.0)
        envs = self.lane_envs[lane]
        return StepTimeout(
            f"worker {lane} (envs {envs.start}..{envs.stop - 1}) did not "
            f"finish within timeout={timeout} s; it was stopped"
        )

    def stop(self, lane: int) -> None:
        """Kill worker ``lane`` (if still alive) and close its pipes, before a restart."""
        proc = self.procs[lane]
        if proc.is_alive():
            proc.kill()
        proc.join(1.0)
        for conn in (self.conns[lane], self._wake_conns[lane]):
            conn.close()

    # -- shutdown ----------------------------------------------------------------------------------
    def join(self, timeout: float) -> None:
        """Wait ``timeout`` s for each worker to exit, then terminate it, then kill it; close every pipe.

        Idempotent.
        """
        for proc in self.procs:
            if proc is None:
                continue
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in (*self.conns, *self._wake_conns, *self._done_conns):
            if conn is None:
                continue
            try:
                conn.close()
            except OSError:
                pass
