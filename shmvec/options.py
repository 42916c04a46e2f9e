"""The options of a :class:`~shmvec.ShmVecEnv`, declared once: checked, resolved and frozen.

``ShmVecEnv``'s keywords are the fields of :class:`Options`; everything that needs the list
derives it from here (``shmvec.make`` sorting its keywords, the SB3, baselines and Ray adapters
checking theirs, a test comparing the constructor's signature). The fields marked ``WORKER``
are what a block applies: they travel to each worker process, as it starts, in one
:class:`~shmvec.protocol.WorkerOptions` (:meth:`Options.for_worker`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gymnasium.vector import AutoresetMode

from shmvec.checks import parse_autoreset_mode, positive_int, usable_cores
from shmvec.protocol import MAX_WORKERS, WorkerOptions

__all__ = ["Options", "passed_on"]

# The mark of a field that a block applies (it reaches the worker in its WorkerOptions).
WORKER = {"worker": True}


@dataclass(frozen=True)
class Options:
    """Every option of a :class:`~shmvec.ShmVecEnv`, resolved (see its docstring for each).

    Built by :meth:`resolve` from the constructor's keywords: defaults filled in from the
    machine (``num_workers``, ``batch_size``, ``torch_threads="auto"``), names parsed
    (``autoreset_mode``), and every value checked, with errors that name the option.
    """

    num_workers: int | None = None
    batch_size: int | None = None
    step_in_main: bool = False
    autoreset_mode: AutoresetMode | str = dataclasses.field(default=AutoresetMode.NEXT_STEP, metadata=WORKER)
    copy: bool = True
    context: str | None = None
    timeout: float | None = None
    validate_actions: bool = True
    on_error: str = "raise"
    check_finite: bool = False
    spin_us: float | None = None
    worker_threads: int | None = dataclasses.field(default=1, metadata=WORKER)
    ordered: bool = False
    torch_threads: int | str | None = "auto"
    warn_slow_loop: bool = True

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in the constructor's order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, num_envs: int, given: dict[str, Any]) -> Options:
        """The options of a vector env of ``num_envs`` envs, from the keywords ``given``."""
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown ShmVecEnv option(s) {unknown}; the options are {list(cls.names())}")
        raw = cls(**given)
        _check_on_error(raw.on_error)
        mode = parse_autoreset_mode(raw.autoreset_mode)
        workers = _count_workers(raw.num_workers, raw.step_in_main, num_envs)
        blocks = workers + (1 if raw.step_in_main else 0)
        torch_threads = raw.torch_threads
        if torch_threads == "auto":
            torch_threads = max(1, usable_cores() - workers)
        elif torch_threads is not None:
            torch_threads = positive_int(torch_threads, "torch_threads")
        return dataclasses.replace(
            raw,
            num_workers=workers,
            batch_size=_check_batch_size(raw.batch_size, num_envs, workers, blocks, mode),
            autoreset_mode=mode,
            ordered=bool(raw.ordered),
            worker_threads=None if raw.worker_threads is None else positive_int(raw.worker_threads, "worker_threads"),
            torch_threads=torch_threads,
            warn_slow_loop=bool(raw.warn_slow_loop),
        )

    def replace(self, name: str, value: Any) -> Options:
        """These options with ``name`` changed (only ``on_error`` and ``check_finite`` may change
        while a vector env runs: the others shape its processes and memory).
        """
        if name not in ("on_error", "check_finite"):
            raise AttributeError(f"{name} is fixed when the vector env is built")
        if name == "on_error":
            _check_on_error(value)
        return dataclasses.replace(self, **{name: value})

    @property
    def num_blocks(self) -> int:
        """Blocks of envs: one per worker, one more with ``step_in_main``."""
        return int(self.num_workers or 0) + (1 if self.step_in_main else 0)

    def for_worker(self, spin: Any = None) -> WorkerOptions:
        """The options a block applies, in a worker or in the calling process: every field marked
        ``WORKER``, as plain values (an enum as its value), and ``spin``, how a worker waits.
        """
        values = {}
        for f in dataclasses.fields(self):
            if f.metadata.get("worker"):
                value = getattr(self, f.name)
                values[f.name] = value.value if isinstance(value, Enum) else value
        return WorkerOptions(**values, spin=spin)


def passed_on(owner: str, given: dict[str, Any], fixed: dict[str, str]) -> None:
    """Check the keywords an adapter passes on to its :class:`~shmvec.ShmVecEnv`.

    Parameters
    ----------
    owner : str
        The adapter named in the error (``"SubprocVecEnv"``, ``"RayVecEnv"``).
    given : dict
        The keyword arguments the user passed on.
    fixed : dict
        Each option the adapter sets itself, and why (or what to use instead).

    Raises
    ------
    TypeError
        For an option the adapter sets itself, or a name that is no option (the message lists
        those it takes), as Python does for a keyword a function does not take.
    """
    for name, why in fixed.items():
        if name in given:
            raise TypeError(f"{owner} sets {name!r} itself: {why}")
    unknown = sorted(set(given) - set(Options.names()))
    if unknown:
        takes = [name for name in Options.names() if name not in fixed]
        raise TypeError(
            f"{owner} got unexpected keyword argument(s) {unknown}; the ShmVecEnv options it takes: {takes}"
        )


def _check_on_error(value: Any) -> None:
    if value not in ("raise", "restart"):
        raise ValueError(f"on_error must be 'raise' or 'restart', got {value!r}")


def _count_workers(num_workers: int | None, step_in_main: bool, num_envs: int) -> int:
    main = 1 if step_in_main else 0
    if num_workers is None:
        return max(0, min(usable_cores(), num_envs) - main)
    if step_in_main and num_workers == 0:
        return 0
    workers = min(positive_int(num_workers, "num_workers"), num_envs - main)
    if workers > MAX_WORKERS:  # a broadcast round counts its workers in 16 bits (protocol.count_base)
        raise ValueError(f"num_workers must be at most {MAX_WORKERS}, got {num_workers}")
    return workers


def _check_batch_size(batch_size: int | None, n: int, workers: int, blocks: int, mode: AutoresetMode) -> int:
    if batch_size is None or batch_size == n:
        return n
    if not isinstance(batch_size, int) or not 0 < batch_size < n:
        raise ValueError(f"batch_size must be an int in 1..num_envs={n}, got {batch_size!r}")
    if mode is AutoresetMode.DISABLED:
        raise ValueError("asynchronous collection supports autoreset modes NEXT_STEP and SAME_STEP, not DISABLED")
    if n % blocks:
        raise ValueError(
            f"asynchronous collection needs num_envs ({n}) divisible into {blocks} equal blocks "
            f"({workers} workers{' + the calling process' if blocks > workers else ''}): "
            "batches are made of whole blocks"
        )
    if batch_size % (n // blocks):
        raise ValueError(
            f"batch_size ({batch_size}) must be a multiple of the envs per block "
            f"({n // blocks} = num_envs {n} / {blocks} blocks)"
        )
    return batch_size
