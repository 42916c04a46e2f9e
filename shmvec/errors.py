"""The exceptions shmvec raises, and where its warnings point.

Where Gymnasium has an exception for the same mistake, shmvec's derives from it, so code that
catches Gymnasium's (``ClosedEnvironmentError``, ``NoAsyncCallError``) catches shmvec's too.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from gymnasium.error import ClosedEnvironmentError, NoAsyncCallError


class ShmVecError(RuntimeError):
    """Base class of every error shmvec raises about its workers."""


class WorkerError(ShmVecError):
    """An exception raised by an environment, in a worker or in the block the calling process steps.

    Attributes
    ----------
    worker_index : int or None
        The worker process whose env raised; ``None`` for the block that the calling process
        steps itself (``step_in_main=True``).
    env_index : int or None
        The env at fault (``None`` when no single env was).
    phase : str
        What the worker was doing: ``"construct"``, ``"reset"``, ``"step"``, ``"call"``, ...
    exc_type, remote_message : str
        The original exception's type name and message.
    remote_traceback : str
        The formatted traceback from the worker process.
    error : ShmVecError or None
        The original exception, where it is one of shmvec's own (a :class:`SnapshotError`, an
        :class:`EnvObsError`): what a caller that expects it raises as itself.
    """

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report
        self.error: ShmVecError | None = report.get("error")
        self.worker_index: int | None = report["worker_index"]
        self.env_index: int | None = report["env_index"]
        self.phase: str = report["phase"]
        self.exc_type: str = report["exc_type"]
        self.remote_message: str = report["message"]
        self.remote_traceback: str = report["traceback"]
        where = "the calling process" if self.worker_index is None else f"worker {self.worker_index}"
        if self.env_index is not None:
            where = f"env {self.env_index} ({where})"
        super().__init__(
            f"{where} raised {self.exc_type} during {self.phase}: {self.remote_message}\n\n"
            f"Remote traceback:\n{self.remote_traceback}"
        )

    def __reduce__(self) -> tuple:  # picklable (Ray re-raises it in the driver): rebuilt from the report
        return type(self), (self.report,)


class WorkerDied(ShmVecError):
    """A worker process exited without being asked to (killed, crashed, ``os._exit``), or could
    not be started (``exitcode`` is then ``None``).
    """

    def __init__(self, worker_index: int, exitcode: int | None, envs: range, hint: str = "") -> None:
        self.worker_index = worker_index
        self.exitcode = exitcode
        self.envs = envs
        self.hint = hint
        if exitcode is not None and exitcode < 0:
            import signal

            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        elif exitcode is None:
            how = "could not be started"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"worker {worker_index} (envs {envs.start}..{envs.stop - 1}) {how}{hint}")

    def __reduce__(self) -> tuple:
        return type(self), (self.worker_index, self.exitcode, self.envs, self.hint)


class NonFiniteError(ShmVecError, ValueError):
    """An env returned a NaN or infinite reward or observation (with ``check_finite=True``).

    The vector env stays usable. From :meth:`~shmvec.ShmVecEnv.recv`, the refused batch is
    not lost: the next ``recv()`` returns it as it is (or ``send(actions, exc.env_ids)`` goes on
    without it).

    Attributes
    ----------
    env_index : int
        The first env with a non-finite value.
    env_ids : numpy.ndarray or None
        From ``recv()``: the ids of the refused batch; ``None`` from ``step``/``reset``/``rollout``.
    infos : dict or None
        The refused step's infos (``None`` from ``reset``).
    """

    def __init__(self, message: str, env_index: int) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.env_ids: Any = None
        self.infos: dict[str, Any] | None = None

    def __reduce__(self) -> tuple:  # pickles through Ray with its attributes
        return (type(self), (self.args[0], self.env_index), self.__dict__)


class PayloadError(ShmVecError, TypeError):
    """A command's arguments (``call``, ``set_attr``, ``reset`` options) cannot be pickled for the
    workers. Raised before any worker hears of the command: the vector env stays usable.
    """


class StepTimeout(ShmVecError, TimeoutError):
    """A command did not finish within the vector env's ``timeout``; the stuck workers are stopped."""


class ClosedError(ShmVecError, ClosedEnvironmentError):
    """The vector env was used after ``close()`` (or after a fault closed it)."""


class NothingInFlightError(ShmVecError, NoAsyncCallError):
    """``recv()`` was called with no env in flight: ``send()`` (or ``async_reset()``) comes first."""

    def __init__(self, message: str) -> None:
        NoAsyncCallError.__init__(self, message, "recv")

    def __reduce__(self) -> tuple:
        return type(self), (self.args[0],)


class ActorDied(ShmVecError):
    """A Ray actor of a :class:`~shmvec.ray.RayVecEnv` died (its process or its node went away).

    Attributes
    ----------
    actor_index : int
    envs : range
        The global indices of the envs it hosted.
    node_ip, node_id : str
        Where it ran.
    """

    def __init__(self, actor_index: int, envs: range, node_ip: str, node_id: str, cause: str) -> None:
        self.actor_index, self.envs, self.node_ip, self.node_id, self.cause = actor_index, envs, node_ip, node_id, cause
        super().__init__(
            f"Ray actor {actor_index} (envs {envs.start}..{envs.stop - 1}) on node {node_ip} "
            f"(id {node_id[:12]}) died: {cause}"
        )

    def __reduce__(self) -> tuple:
        return type(self), (self.actor_index, self.envs, self.node_ip, self.node_id, self.cause)


class EnvObsError(ShmVecError, ValueError):
    """An env returned something that does not fit its declared space (raised where the env is
    stepped: from a worker it comes back inside a :class:`WorkerError`). Also a ``ValueError``.
    """


class SnapshotError(ShmVecError, TypeError):
    """An env's state cannot be captured or restored (``get_state``, ``set_state``,
    ``load_state_dict``): the message names the env, its layers, and what stood in the way.
    From a worker it comes back inside a :class:`WorkerError`; the vector env stays usable.
    """


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warn, naming the user's line: the first frame outside shmvec, however many of shmvec's
    own calls (step hooks, a measured window) lie between.
    """
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
