"""The worker processes of a pool: start, handshake, restart, shutdown.

Worker ``k`` is the process that steps block ``k`` (the blocks stepped by workers come first;
the calling process's block, if any, is the last). This module owns the processes and their
pipes; what runs over the shared segment, one command round at a time, is ``pool``'s.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Pipe
from multiprocessing.connection import wait as mp_wait
from typing import Any

from shmvec import protocol as P
from shmvec import start_methods
from shmvec.errors import StepTimeout, WorkerDied, WorkerError
from shmvec.registrations import carried
from shmvec.sync import poll_array
from shmvec.worker import worker_main

# Seconds between looks at a worker's liveness while waiting for a message on its pipe.
POLL_S = 0.5

# What a worker forked under the per-start policy waits for: no other thread outlived the fork.
_ALONE = b"alone"

# Python 3.12+'s warning after a fork that other threads outlived (a regular expression).
_FORK_WARNING = r".*use of fork\(\) may lead to deadlocks in the child"


def raise_construct_failure(msg: Any) -> None:
    """Raise what a block's construction reported, if it failed: :class:`WorkerError` for a
    :class:`~shmvec.protocol.ConstructError`, ``ValueError`` for a :class:`~shmvec.protocol.Mismatch`.
    """
    if isinstance(msg, P.ConstructError):
        raise WorkerError(msg.report)
    if isinstance(msg, P.Mismatch):
        raise ValueError(msg.message)


class WorkerProcesses:
    """One worker process per block in ``block_envs``, each building and stepping that block's envs.

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
        Every env's factory; worker ``block`` gets ``env_fns[block_envs[block]]``, pickled here
        (with the registrations it may lack, :mod:`shmvec.registrations`, unless forked).
    block_envs : list of range
        The envs of each block served by a worker.
    context : str or None
        ``multiprocessing`` start method (``"fork"``, ``"forkserver"``, ``"spawn"``), or ``None``
        (``"auto"``): shmvec's policy, per start (:mod:`shmvec.start_methods`).
    options : WorkerOptions
        What every worker applies, given to each process as it starts.

    Raises
    ------
    TypeError
        If a block's factories cannot be pickled (nothing is started then).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        block_envs: list[range],
        context: str | None,
        options: P.WorkerOptions,
    ) -> None:
        import cloudpickle

        self.context: str = start_methods.requested(context)  # a start method, or "auto"
        # A worker that is not forked lacks the envs registered in the user's main module.
        specs = carried() if self.context != "fork" else []
        self._blobs: list[bytes] = []
        for envs in block_envs:
            try:
                self._blobs.append(cloudpickle.dumps((specs, list(env_fns[envs.start : envs.stop]))))
            except Exception as exc:
                raise TypeError(f"env_fns[{envs.start}:{envs.stop}] cannot be pickled for the workers: {exc}") from exc
        self.block_envs = block_envs
        self.options = options
        count = len(block_envs)
        self.procs: list[Any] = [None] * count  # multiprocessing.Process, once started
        self.methods: list[str | None] = [None] * count  # how each one was started
        self.sentinels: list[int] = [-1] * count  # each process's sentinel (read on every blocking wait)
        self.conns: list[Any] = [None] * count  # each worker's duplex pipe (handshake, payloads, replies)
        # One wake pipe per block, for the pool's life: a restarted worker reads the same one, so
        # the workers that relay wake-ups to it (their write ends) need nothing new.
        self._wake: list[tuple[Any, Any]] = []
        for _ in range(count):
            wake_r, wake_w = Pipe(duplex=False)
            os.set_blocking(wake_r.fileno(), False)
            os.set_blocking(wake_w.fileno(), False)
            self._wake.append((wake_r, wake_w))
        self.wake_fds: list[int] = [w.fileno() for _, w in self._wake]  # write end of each worker's wake pipe
        done_r, done_w = Pipe(duplex=False)
        self._done_conns = (done_r, done_w)  # done_w stays open: restarted workers get it too
        self.done_fd: int = done_r.fileno()  # read end of the pipe every worker rings when done
        # What the compiled broadcast round's sleep watches: the done pipe, then each worker's
        # sentinel (poll(2)'s struct pollfd array, kept up to date at each start).
        self.watched = poll_array(1 + count)
        self.watched["fd"][0] = self.done_fd
        os.set_blocking(self.done_fd, False)
        os.set_blocking(done_w.fileno(), False)

    # -- start-up ------------------------------------------------------------------------------
    def start(self, block: int) -> None:
        """Start (or restart) the worker process of ``block``.

        Under the per-start policy (``context="auto"``, :mod:`shmvec.start_methods`) the worker
        is forked, and waits until this process confirms that no thread but its own outlived the
        fork's prepare handlers (OpenBLAS's pool stops there; OpenMP's, numba's, torch's and the
        user's threads do not): then it goes ahead, and otherwise it is killed before it runs
        anything and the forkserver starts the worker instead.
        """
        if self.context != start_methods.AUTO:
            self._launch(block, self.context, checked=False)
            return
        self._launch(block, "fork", checked=True)
        if start_methods.threads() == 1:
            try:
                self.conns[block].send_bytes(_ALONE)
            except (BrokenPipeError, ConnectionResetError):
                pass  # it died already: its handshake says so
            return
        self.stop(block)  # it may hold a lock another thread held at the fork: it never runs
        self._launch(block, "forkserver", checked=False)

    def _launch(self, block: int, method: str, checked: bool) -> None:
        """Start the worker process of ``block`` by ``method``; if ``checked``, one that waits for
        :data:`_ALONE` before it runs anything.
        """
        ctx = start_methods.context(method)
        parent_conn, child_conn = Pipe()
        relay = [(c, self._wake[c][1]) for c in P.relay_children(block, len(self.block_envs))]
        args = (
            block,
            self.block_envs[block].start,
            self._blobs[block],
            child_conn,
            self._wake[block][0],
            self._done_conns[1],
            self.options,
            relay,
        )
        target = _when_alone if checked else worker_main
        proc = ctx.Process(target=target, args=args, name=f"shmvec-worker-{block}", daemon=True)
        try:
            with warnings.catch_warnings():
                if checked:  # a fork that a thread outlived is never used: Python need not warn of it
                    warnings.filterwarnings("ignore", message=_FORK_WARNING, category=DeprecationWarning)
                proc.start()
        except (ConnectionError, EOFError) as exc:
            # A forkserver that dies as it starts (Python 3.14's default start method: the
            # server imports the main module first, and a script without a main guard starts
            # a vector env there) leaves only a reset connection to say so.
            parent_conn.close()
            child_conn.close()
            if method != "forkserver":
                raise
            cause = f"; the forkserver that starts it died ({type(exc).__name__}: {exc})"
            raise WorkerDied(block, None, self.block_envs[block], cause + _main_guard_hint(method)) from exc
        child_conn.close()
        self.procs[block], self.conns[block], self.sentinels[block] = proc, parent_conn, proc.sentinel
        self.watched["fd"][1 + block] = proc.sentinel
        self.methods[block] = method

    def spaces(self, block: int, deadline: float | None) -> P.Spaces:
        """The spaces (and metadata) that the envs of ``block`` reported once built.

        Raises :class:`WorkerError` if building an env raised, ``ValueError`` if the block's
        envs disagree, :class:`WorkerDied` or :class:`StepTimeout` if the worker is lost.
        """
        msg = self.recv(block, deadline, "construct")
        raise_construct_failure(msg)
        return msg

    def attach(self, block: int, attach: P.Attach, fds: list[int]) -> None:
        """Hand worker ``block`` its segments: how to use them (``attach``), then their
        descriptors, the main segment's first.
        """
        from multiprocessing.reduction import send_handle

        self.conns[block].send(attach)
        for fd in fds:
            send_handle(self.conns[block], fd, self.procs[block].pid)

    def ready(self, block: int, deadline: float | None) -> None:
        """Wait for worker ``block`` to confirm that it mapped the segment."""
        msg = self.recv(block, deadline, "attach")
        raise_construct_failure(msg)
        if not isinstance(msg, P.Ready):
            raise RuntimeError(f"worker {block} answered {msg!r} to attach")

    # -- messages --------------------------------------------------------------------------------
    def send(self, block: int, payload: bytes, fd: int | None = None) -> None:
        """Send a command's pickled payload (and a descriptor after it) to worker ``block``.

        A worker that died since its last command (the OOM killer strikes any time) is passed
        over: the other blocks must still get their payloads, or they would wait for them
        forever, and the round's wait reports this one as :class:`WorkerDied` (its sentinel is
        ready and its DONE never comes).
        """
        try:
            self.conns[block].send_bytes(payload)  # the worker's conn.recv() unpickles it
            if fd is not None:
                from multiprocessing.reduction import send_handle

                send_handle(self.conns[block], fd, self.procs[block].pid)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def recv(self, block: int, deadline: float | None, phase: str) -> Any:
        """Receive one message from worker ``block``, watching its liveness and ``deadline``."""
        conn, proc = self.conns[block], self.procs[block]
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                raise self.stop_overdue(block, phase, None)
            ready = mp_wait([conn, proc.sentinel], wait)
            if conn in ready:
                try:
                    return conn.recv()
                except (EOFError, ConnectionResetError, BrokenPipeError):
                    pass  # the worker went away: its sentinel says so
                except Exception as exc:  # sent, but this process cannot unpickle it (a module it lacks)
                    raise self.unreadable(block, phase, exc) from exc
            if proc.sentinel in ready or not proc.is_alive():
                raise self.died(block, phase)

    # -- faults ------------------------------------------------------------------------------------
    def died(self, block: int, phase: str | None = None) -> WorkerDied:
        """Reap worker ``block``, which exited (during ``phase``, where known); the failure to report."""
        proc = self.procs[block]
        proc.join(1.0)
        hint = ""
        method = self.methods[block]
        if phase == "construct" and method != "fork" and proc.exitcode == 1:
            # The usual cause: a script without a main guard, which the worker imports again.
            hint = _main_guard_hint(str(method))
        return WorkerDied(block, proc.exitcode, self.block_envs[block], hint)

    def unreadable(self, block: int, phase: str, exc: Exception) -> WorkerError:
        """Stop worker ``block``, whose message during ``phase`` this process cannot unpickle;
        the failure to report (the error names the block's first env).
        """
        self.stop(block)
        return WorkerError(P.error_report(exc, block, self.block_envs[block].start, f"{phase}, read by the caller"))

    def stop_overdue(self, block: int, phase: str, timeout: float | None) -> StepTimeout:
        """Kill worker ``block``, which overran ``timeout`` (``None``: a deadline of the set-up)
        during ``phase``; the failure to report.
        """
        proc = self.procs[block]
        if proc.is_alive():
            proc.kill()
        proc.join(1.0)
        envs = self.block_envs[block]
        limit = "the start-up deadline" if timeout is None else f"timeout={timeout} s"
        return StepTimeout(
            f"worker {block} (envs {envs.start}..{envs.stop - 1}) did not finish within {limit} ({phase}); "
            "it was stopped"
        )

    def stop(self, block: int) -> None:
        """Kill worker ``block`` (if still alive) and close its pipe, before a restart (its wake
        pipe stays: the new worker reads it).
        """
        proc = self.procs[block]
        if proc is not None:  # (None: stopped already)
            if proc.is_alive():
                proc.kill()
            proc.join(1.0)
            if _release(proc):
                self.procs[block] = None
        self.conns[block].close()

    # -- shutdown ----------------------------------------------------------------------------------
    def join(self, timeout: float) -> None:
        """Wait ``timeout`` s for each worker to exit, then terminate it, then kill it; close every pipe.

        Idempotent.
        """
        for block, proc in enumerate(self.procs):
            if proc is None:
                continue
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
            if _release(proc):
                self.procs[block] = None
        for conn in (*self.conns, *(end for pipe in self._wake for end in pipe), *self._done_conns):
            if conn is None:
                continue
            try:
                conn.close()
            except OSError:
                pass


def _when_alone(*args: Any) -> None:
    """A worker forked under the per-start policy: :func:`~shmvec.worker.worker_main` once the
    caller says that no other thread outlived the fork (else the caller kills it first).
    """
    try:
        alone = args[3].recv_bytes() == _ALONE
    except (EOFError, OSError):
        return
    if alone:
        worker_main(*args)


def _release(proc: Any) -> bool:
    """Close ``proc``'s sentinel and other resources once it has exited, at once rather than when
    the object is collected; whether it could (a process that did not exit keeps them).
    """
    try:
        proc.close()
    except ValueError:
        return False
    return True


def _main_guard_hint(context: str) -> str:
    """What to do when a worker started by ``context`` (not fork) dies as it starts: the usual
    cause is a script without a main guard, which that start method imports again.
    """
    where = "the forkserver and each worker import" if context == "forkserver" else "each worker imports"
    return (
        f". Under the {context!r} start method {where} your main module again: create vector envs "
        'under `if __name__ == "__main__":` (the error in that process is on stderr)'
    )
