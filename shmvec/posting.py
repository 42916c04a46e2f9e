"""Posting a round: its command words, ``GO`` and the wake-ups, on the blocks' control lines or,
for every worker at once, on main's (a broadcast); and its payloads on the workers' pipes.

The words are published as ``docs/architecture.md`` ("Memory ordering": [GO], [SLEEP],
[RELAY]) argues; a Ctrl-C while a round is posted leaves exactly the blocks whose ``GO`` was
stored running it (:meth:`Posting.posted`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shmvec import probes
from shmvec import protocol as P
from shmvec.broadcast import PAYLOAD_FLAG, BroadcastRound, Refused, Staged
from shmvec.errors import PayloadError
from shmvec.processes import WorkerProcesses

__all__ = ["Posting", "pickle_payloads", "sigint_held"]


def pickle_payloads(payloads: list, block_ids: list[int]) -> dict[int, bytes]:
    """The worker blocks' payloads, pickled before any worker is told that one is coming: a payload
    that cannot be pickled then fails with every worker still idle, instead of leaving them
    waiting for it. A payload shared by several blocks (a ``call``'s arguments) is pickled once.
    """
    from multiprocessing.reduction import ForkingPickler

    blobs: dict[int, bytes] = {}
    done: dict[int, bytes] = {}
    for block in block_ids:
        payload = payloads[block]
        if payload is not None:
            blob = done.get(id(payload))
            if blob is None:
                try:
                    blob = done[id(payload)] = bytes(ForkingPickler.dumps(payload))
                except Exception as exc:
                    raise PayloadError(
                        f"the arguments for block {block} cannot be pickled: {type(exc).__name__}: {exc}"
                    ) from exc
            blobs[block] = blob
    return blobs


@contextmanager
def sigint_held() -> Iterator[None]:
    """Hold a Ctrl-C back for the block inside: it arrives as the block ends, as it would have.

    The handler is swapped, not the signal blocked: a thread of another library (torch's, a
    user's) would take a blocked signal, and CPython raises it in the main thread all the same.
    Only the main thread sees KeyboardInterrupt, so elsewhere there is nothing to hold.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)  # (Python's default handler raises KeyboardInterrupt)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


class Posting:
    """How main posts rounds to its worker blocks (``lines``: their control lines, then main's)."""

    def __init__(
        self, lines: list[memoryview], workers: WorkerProcesses, num_workers: int, round_: BroadcastRound
    ) -> None:
        self.lines, self.main_line, self.workers, self.round = lines, lines[-1], workers, round_
        self.num_workers = num_workers
        self.broadcast = False  # the last round posted was a broadcast

    def post(
        self,
        cmd: int,
        arg: int,
        seq: int,
        block_ids: list[int],
        payloads: list | None,
        blobs: dict[int, bytes] | None,
        fd: int | None,
        actions: Staged | None = None,
    ) -> None:
        """Post round ``seq``: ``cmd`` with ``arg`` to the worker blocks ``block_ids``, each with
        its pickled payload in ``blobs`` (and ``fd`` after it): as a broadcast where it is one
        command, with no payload, for every worker; otherwise on each block's line, waking
        those that sleep. ``actions``: a staged action batch (``BroadcastRound.run``), checked
        and copied first; :class:`~shmvec.broadcast.Refused` if a row is out of bounds, with
        nothing posted.
        """
        if blobs:
            # A GO and its payload go together: a Ctrl-C between them would leave the worker
            # waiting for a payload never sent (SIGINT is held until both are out).
            with sigint_held():
                self.post(cmd, arg, seq, block_ids, payloads, None, None)
                self._send(block_ids, blobs, fd)
            return
        if payloads is None and fd is None and len(block_ids) == self.num_workers:
            self.post_broadcast(cmd, arg, seq, actions)
            return
        # Per block, on each block's line (the compiled round posts it; PAYLOAD says which get one).
        self.broadcast = False
        if payloads is not None:
            block_ids = [b + PAYLOAD_FLAG if payloads[b] is not None else b for b in block_ids]
        if self.round.post_blocks(cmd, arg, seq, block_ids, actions):
            raise Refused

    def post_broadcast(self, cmd: int, arg: int, seq: int, actions: Staged | None = None) -> None:
        """Post round ``seq`` as a broadcast: ``cmd`` with ``arg`` to every worker at once, on
        main's line, with at most ``protocol.ROOTS`` wake-ups (the tree's roots; the workers
        relay the others, ``protocol.relay_children``). The compiled round posts it
        (:meth:`shmvec.broadcast.BroadcastRound.post`).
        """
        self.broadcast = True
        if self.round.post(cmd, arg, seq, actions):
            raise Refused

    def _send(self, block_ids: list[int], blobs: dict[int, bytes], fd: int | None) -> None:
        """Send each block of ``block_ids`` its pickled payload (and ``fd`` after it)."""
        probe = probes.probe
        for block in block_ids:
            if block in blobs:
                self.workers.send(block, blobs[block], fd)
                if probe:
                    probe("main:sent")

    def posted(self, block: int, seq: int) -> bool:
        """Whether worker ``block`` was told of round ``seq`` (its GO, or the broadcast's, stored)."""
        return (self.broadcast and self.main_line[P.GO] == seq) or self.lines[block][P.GO] == seq
