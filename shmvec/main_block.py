"""The block the calling process steps (``step_in_main``), driven as a worker's is: a command is
parked when the round is posted, run while main would otherwise wait, and its result taken when
the round is collected.
"""

from __future__ import annotations

from typing import Any

from shmvec import protocol as P
from shmvec.errors import WorkerError
from shmvec.stepper import Stepper

__all__ = ["MainBlock"]


class MainBlock:
    """The calling process's block.

    ``WorkerPool.submit`` parks a command here, ``WorkerPool.wait`` runs it (in this process,
    while the workers step theirs), ``Replies.collect`` takes its result: the same path for
    synchronous and asynchronous rounds.
    """

    __slots__ = ("index", "stepper", "pending", "result")

    def __init__(self, index: int, stepper: Stepper) -> None:
        self.index = index
        self.stepper = stepper
        self.pending: tuple[int, Any, int] | None = None  # (cmd, payload, arg) submitted, not run yet
        self.result: tuple[Any, Exception | None] | None = None  # (reply, failure) run, not collected yet

    def run_pending(self) -> None:
        """Run the submitted command; keep its ``(reply, failure)`` for :meth:`take`."""
        (cmd, payload, arg), self.pending = self.pending, None  # type: ignore[misc]
        stepper = self.stepper
        try:
            self.result = stepper.run(cmd, payload, arg), None
        except Exception as exc:
            report = P.error_report(exc, self.index, stepper.current, P.phase(cmd), cmd)
            report["worker_index"] = None  # no worker: the calling process stepped it
            self.result = None, WorkerError(report)

    def take(self) -> tuple[Any, Exception | None]:
        result, self.result = self.result, None
        return result if result is not None else (None, None)
