"""How a block joins its pool, at start-up and on a restart alike: its envs built (by a new
worker process, or in the calling process), their spaces checked against the pool's, and the
segments handed over: the main one, and each one attached since the start.

:meth:`Joining.join` is the one path. At start-up it brings in every block, and the segment
is laid out from the spaces they reported; a restart brings in one block, checked against the
spaces the pool already has, and hands it the segments the pool already holds. The command
rounds over the joined blocks are :mod:`shmvec.pool`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from shmvec import protocol as P
from shmvec.processes import WorkerProcesses, raise_construct_failure
from shmvec.segment import Segment
from shmvec.stepper import Stepper, build_envs, close_all

__all__ = ["START_S", "Joining", "Segments"]

# Seconds a block may take to join (build its envs, report, attach) when the vector env has no
# ``timeout``: generous, for envs that compile or download as they are built, and emulated CPUs.
START_S = 600.0


class Segments(NamedTuple):
    """What a joining block is handed: the main segment, and the segments attached since the
    start, by the command that attached them (a block that joins later gets those whose row
    says ``Restart.RESEND``).
    """

    main: Segment
    attached: dict[P.Command, Segment]


class Joining:
    """The blocks of a pool, brought in: worker processes (:mod:`shmvec.processes`) and the
    calling process's block.

    Parameters
    ----------
    env_fns : sequence of callables returning ``gymnasium.Env``
    blocks : list of range
        The envs of each block; the workers' first, then the calling process's, if any.
    main_index : int or None
        The calling process's block (``step_in_main``).
    options : WorkerOptions
        What every block applies (each worker process gets it as it starts).
    context : str or None
        The ``multiprocessing`` start method.
    timeout : float or None
        Seconds a block may take to join (at least 30); ``None``: :data:`START_S`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        blocks: list[range],
        main_index: int | None,
        options: P.WorkerOptions,
        context: str | None,
        timeout: float | None,
    ) -> None:
        self.env_fns, self.blocks, self.main_index = env_fns, blocks, main_index
        self.options, self.timeout = options, timeout
        num_workers = len(blocks) - (0 if main_index is None else 1)
        self.workers = WorkerProcesses(env_fns, blocks[:num_workers], context, options)

    def join(
        self,
        block_ids: list[int],
        expected: P.Spaces | None,
        segments: Callable[[P.Spaces], Segments],
    ) -> tuple[P.Spaces, Stepper | None]:
        """Bring ``block_ids`` in: start each (a worker process; the calling process's block builds
        its envs here), check that their spaces agree with ``expected`` (``None``: with the
        lowest block's), then hand each the segments ``segments(spaces)`` returns.

        Returns ``(spaces, stepper)``: the spaces checked against, and the calling process's
        :class:`Stepper` if its block joined (else ``None``). Raises what construction raises:
        :class:`~shmvec.WorkerError` (an env's constructor, or attaching, failed in a worker),
        ``ValueError`` (spaces that disagree), :class:`~shmvec.WorkerDied` or
        :class:`~shmvec.StepTimeout` (a worker lost); the caller shuts the block down.
        """
        # A handshake that never completes (a constructor that hangs, a forked child deadlocked)
        # ends in StepTimeout naming the worker and its phase, not in a wait for good.
        deadline = time.monotonic() + (START_S if self.timeout is None else max(self.timeout, 30.0))
        main, workers = self.main_index, [b for b in block_ids if b != self.main_index]
        for block in workers:  # (they build their envs while this process builds its own)
            self.workers.start(block)
        main_envs: list = []
        try:
            found: list[tuple[int, P.Spaces]] = []  # (first env, spaces) of each block
            if main in block_ids:
                main_envs = self._build_main_envs()
                found.append((self.blocks[main].start, P.Spaces.of(main_envs[0])))
            found += [(self.blocks[b].start, self.workers.spaces(b, deadline)) for b in workers]
            found.sort(key=lambda f: f[0])
            spaces = expected if expected is not None else found[0][1]
            for start, other in found:
                why = other.mismatch(start, spaces, 0)
                if why is not None:
                    raise ValueError(why)
            handed = segments(spaces)
            resent = {cmd: seg for cmd, seg in handed.attached.items() if cmd.restart is P.Restart.RESEND}
            attach = P.Attach(handed.main.layout, [(int(cmd), seg.layout) for cmd, seg in resent.items()])
            fds = [seg.fd for seg in (handed.main, *resent.values())]
            for block in workers:
                self.workers.attach(block, attach, fds)  # type: ignore[arg-type]
            for block in workers:
                self.workers.ready(block, deadline)
            stepper = self.stepper(main_envs, handed) if main_envs else None
        except BaseException:
            close_all(main_envs)  # built, never handed over
            raise
        return spaces, stepper

    def _build_main_envs(self) -> list:
        envs = self.blocks[self.main_index]  # type: ignore[index]
        built = build_envs(self.env_fns[envs.start : envs.stop], envs.start, self.main_index)  # type: ignore[arg-type]
        raise_construct_failure(built)
        assert isinstance(built, list)
        return built

    def stepper(self, envs: list, handed: Segments) -> Stepper:
        """The calling process's block: a :class:`Stepper` on this process's mapping of every
        segment (as a worker maps them from their descriptors).
        """
        env0, main = envs[0], handed.main
        stepper = Stepper(
            envs,
            self.blocks[self.main_index].start,  # type: ignore[index]
            main.layout,
            main.views,
            self.options,
            env0.observation_space,
            env0.action_space,
        )
        for cmd, segment in handed.attached.items():
            stepper.run(cmd, (segment.layout, segment.mapping))
        return stepper
