"""The exceptions shmvec raises in the main process."""

from __future__ import annotations

from typing import Any


class ShmVecError(RuntimeError):
    """Base class of every error shmvec raises about its workers."""


class WorkerError(ShmVecError):
    """An exception raised by an environment inside a worker.

    Attributes
    ----------
    worker_index, env_index : int
        Where it happened (``env_index`` is ``None`` when no single env was at fault).
    phase : str
        What the worker was doing: ``"construct"``, ``"reset"``, ``"step"``, ``"call"``, ...
    exc_type, remote_message : str
        The original exception's type name and message.
    remote_traceback : str
        The formatted traceback from the worker process.
    """

    def __init__(self, report: dict[str, Any]) -> None:
        self.worker_index: int = report["worker_index"]
        self.env_index: int | None = report["env_index"]
        self.phase: str = report["phase"]
        self.exc_type: str = report["exc_type"]
        self.remote_message: str = report["message"]
        self.remote_traceback: str = report["traceback"]
        where = f"env {self.env_index} (worker {self.worker_index})" if self.env_index is not None else f"worker {self.worker_index}"
        super().__init__(
            f"{where} raised {self.exc_type} during {self.phase}: {self.remote_message}\n\n"
            f"Remote traceback:\n{self.remote_traceback}"
        )


class WorkerDied(ShmVecError):
    """A worker process exited without being asked to (killed, crashed, ``os._exit``)."""

    def __init__(self, worker_index: int, exitcode: int | None, envs: range) -> None:
        self.worker_index = worker_index
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            import signal

            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"worker {worker_index} (envs {envs.start}..{envs.stop - 1}) {how}")


class NonFiniteError(ShmVecError, ValueError):
    """An env returned a NaN or infinite reward or observation (with ``check_finite=True``)."""


class StepTimeout(ShmVecError, TimeoutError):
    """A command did not finish within the vector env's ``timeout``; the stuck workers are stopped."""


class ClosedError(ShmVecError):
    """The vector env was used after ``close()`` (or after a fault closed it)."""
