"""A round's statuses and replies: read from each block's ``replies`` row, or from its worker's
pipe when too large for it; and the pickled leaves' regions (spaces with no fixed size) that a
step sends with its payload and a reply brings back.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np

from shmvec import protocol as P
from shmvec.completion import Failures
from shmvec.errors import StepTimeout, WorkerDied, WorkerError
from shmvec.layout import Layout
from shmvec.main_block import MainBlock
from shmvec.processes import WorkerProcesses
from shmvec.protocol import Command, Status

__all__ = ["Replies"]

_OK = int(Status.OK)  # (a plain int: comparing with an IntEnum member goes through its class)


class Replies:
    """How main reads a round's results that are not in the result regions.

    Parameters
    ----------
    layout : Layout
        The main segment's; ``views``, this process's views of it.
    lines : list of memoryview
        The control lines.
    workers : WorkerProcesses
    blocks : list of range
        The envs of each block.
    commands : list of int
        Each block's last command (the pool's list, shared).
    """

    def __init__(
        self,
        layout: Layout,
        views: dict[str, np.ndarray],
        lines: list[memoryview],
        workers: WorkerProcesses,
        blocks: list[range],
        commands: list[int],
    ) -> None:
        self.views, self.lines, self.workers, self.blocks, self.commands = views, lines, workers, blocks, commands
        self.rows = [memoryview(row) for row in views["replies"]]  # each block's row of the replies region
        # The action regions a STEP sends each worker in its payload, and whether STEP and RESET
        # replies carry observation regions.
        self.pickled_act: list[str] = layout.pickled("act/")
        self.pickled_obs = bool(layout.pickled("obs/"))

    def action_payloads(self, block_ids: list[int]) -> list[dict[str, np.ndarray] | None]:
        """Each worker block's slice of the pickled action regions (``None`` for other blocks)."""
        payloads: list[dict[str, np.ndarray] | None] = [None] * len(self.blocks)
        for block in block_ids:
            sl = slice(self.blocks[block].start, self.blocks[block].stop)
            payloads[block] = {name: self.views[name][sl] for name in self.pickled_act}
        return payloads

    def collect(
        self, block_ids: list[int], timeout: float | None, main: MainBlock | None
    ) -> tuple[dict[int, Any], Failures]:
        """Statuses and replies of finished blocks: ``({block: reply}, {block: failure})``.

        Only blocks whose status says a reply follows appear in the first dict.
        """
        replies: dict[int, Any] = {}
        failures: Failures = {}
        deadline: float | None = -1.0  # computed at the first reply to read: most rounds have none
        lines, commands = self.lines, self.commands
        for block in block_ids:
            if main is not None and block == main.index:
                reply, exc = main.take()
                if exc is not None:
                    failures[block] = exc
                elif reply is not None:
                    replies[block] = reply
                continue
            line = lines[block]
            status = line[P.STATUS]
            if status == _OK:
                continue
            size = line[P.REPLY_LEN]
            if size >= 0:  # in shared memory: no syscall, no wait
                msg = pickle.loads(self.rows[block][:size])
            else:
                if deadline == -1.0:
                    deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    msg = self.workers.recv(block, deadline, P.phase(commands[block]))
                except (WorkerDied, StepTimeout) as exc:
                    failures[block] = exc
                    continue
            if status == Status.REPLY:
                if self.pickled_obs and commands[block] in (Command.STEP, Command.RESET):
                    msg = self._absorb(block, msg)
                    if msg is None:
                        continue
                replies[block] = msg
            else:
                failures[block] = WorkerError(msg)
        return replies, failures

    def _absorb(self, block: int, reply: tuple) -> Any:
        """Copy the pickled observation regions that worker ``block`` sent with a STEP or RESET
        reply into this process's arrays; return the reply's own part (infos or ``None``).
        """
        reply, regions = reply
        sl = slice(self.blocks[block].start, self.blocks[block].stop)
        for name, values in regions.items():
            self.views[name][sl] = values
        return reply
