"""Asynchronous collection (EnvPool's style): the ``send``/``recv`` part of :class:`~shmvec.ShmVecEnv`.

``recv`` hands back whichever ``batch_size`` envs finish first (whole blocks), and ``send``
steps the envs it returned: the workers of the other blocks keep stepping meanwhile. The rounds
are the :class:`~shmvec.session.Session`'s; this module keeps the batches (``docs/async.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shmvec.async_batches import Batch
from shmvec.blocks import reset_payloads
from shmvec.checks import seeds_per_env
from shmvec.lifecycle import Lifecycle
from shmvec.protocol import Command
from shmvec.session import Session

__all__ = ["AsyncCollection"]

_READY = Lifecycle.READY
_STEP = int(Command.STEP)


class AsyncCollection:
    """The asynchronous part of :class:`~shmvec.ShmVecEnv`'s API (a base class of it).

    Its state: the batch the last ``recv`` returned (until a ``send``). The batches made so far
    are the session's (``Session.batches``); a batch that ``check_finite`` refused waits in
    ``Session.held`` for the next ``recv``.
    """

    _session: Session
    num_envs: int
    copy: bool
    ordered: bool

    def _start_collection(self, batch_size: int) -> None:
        pool = self._session.pool
        self._last: Batch | None = None
        # Whole blocks per recv: all of them in sync mode (whose blocks may differ in size by one env).
        self._batch_blocks = len(pool.blocks) if batch_size == self.num_envs else batch_size // len(pool.blocks[0])

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Start resetting every env without waiting; :meth:`recv` returns the batches.

        ``seed`` and ``options`` are as in :meth:`reset` (``reset_mask`` excepted).
        """
        session = self._session
        session.guard("async_reset", needs_reset=False)
        seeds = seeds_per_env(seed, self.num_envs)
        blocks = session.pool.blocks
        self._submit(Command.RESET, list(range(len(blocks))), reset_payloads(seeds, options, None, blocks))
        session.state = Lifecycle.READY

    def send(self, actions: Any, env_ids: Any) -> None:
        """Step the envs ``env_ids`` (those :meth:`recv` just returned) with ``actions``.

        ``actions`` holds one row per env of ``env_ids``, in that order. After :meth:`reset`,
        every env is ready for a ``send``.
        """
        session = self._session
        if session.state is not _READY:
            session.guard("send", sync=False)  # (raises)
        batch = self._last
        if batch is None or env_ids is not batch.ids:  # the usual loop passes the (read-only) ids recv() returned
            batch = session.batches.covering(env_ids, session.states, self._last is not None)
        session.send(actions, batch)
        self._last = None

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Wait for ``batch_size`` envs to finish; return their results and ids.

        Returns ``(obs, rewards, terminations, truncations, infos, env_ids)``, each with one row
        per env of ``env_ids`` (a whole number of blocks, in env order): ``batch_size``
        envs, or all those in flight if fewer (when you hold some back). Blocks that finish
        first are returned first. Autoreset, infos and episode statistics behave as in
        :meth:`step`. With ``copy=False`` a batch of adjacent blocks comes as read-only views.
        ``env_ids`` is read-only: pass it back to :meth:`send` as it is (the cheapest check).
        With ``ordered=True`` the blocks sent first are returned first, whenever they finish.
        """
        session = self._session
        if session.state is not _READY:
            session.guard("recv", needs_reset=False, sync=False)
        result, self._last = session.recv(self._batch_blocks, self.ordered, self.copy)
        return result

    def _submit(self, cmd: int, blocks: list[int], payloads: list | None) -> None:
        self._session.submit(cmd, blocks, payloads)
        self._last = None
