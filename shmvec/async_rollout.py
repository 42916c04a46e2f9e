"""``AsyncRollout``: ``[T, N]`` rollout storage that asynchronous batches fill env by env.

With :meth:`ShmVecEnv.recv` every env advances at its own pace, so a PPO loop cannot write
"step t" for all envs at once. ``AsyncRollout`` keeps one write position per env: each env's
``T`` transitions land in its own column, in order, ready for :func:`shmvec.gae`.

Example
-------
>>> import numpy as np, shmvec
>>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2, batch_size=2)
>>> rollout = shmvec.AsyncRollout(4, num_steps=8, fields={"obs": ((4,), np.float32), "values": ((), np.float32)})
>>> envs.async_reset(seed=0)
>>> while not rollout.full:
...     obs, rew, term, trunc, infos, ids = envs.recv()
...     rollout.record_outcome(ids, rew, term, trunc)
...     values = obs[:, 0]                                  # your critic here
...     actions = np.zeros(len(ids), dtype=np.int64)          # your actor here
...     go = rollout.record_step(ids, obs=obs, values=values)
...     if go.any():
...         envs.send(actions[go], ids[go])
>>> adv, ret = shmvec.gae(rollout.rewards, rollout["values"], rollout.terminations,
...                      rollout.truncations, rollout.last["values"], autoreset="next_step",
...                      valid=rollout.valid)
>>> adv.shape
(8, 4)
>>> envs.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec.checks import parse_autoreset_mode


class AsyncRollout:
    """Per-env rollout columns filled from batches of ``(env_ids, ...)``.

    Parameters
    ----------
    num_envs, num_steps : int
        The storage is ``[num_steps, num_envs, ...]``.
    fields : dict
        Per-step arrays you record with each new step: ``name -> (shape, dtype)`` for one env,
        e.g. ``{"obs": ((4,), np.float32), "actions": ((), np.int64), "values": ((), np.float32)}``.
    autoreset_mode : AutoresetMode or str, default NEXT_STEP
        The vector env's mode: under NEXT_STEP the step after an episode end is marked invalid.

    Attributes
    ----------
    rewards, terminations, truncations : ndarray ``[T, N]``
        The outcome of each recorded step.
    valid : ndarray ``[T, N]`` bool
        False where a step was the reset step that follows an episode end under NEXT_STEP
        autoreset (its action was ignored): pass it to :func:`shmvec.gae` with
        ``autoreset="next_step"``. All True under SAME_STEP.
    last : dict of ndarray ``[N, ...]``
        The fields recorded for the state after each env's last step (``last["values"]`` is
        the bootstrap value ``V(s_T)``).
    """

    def __init__(
        self,
        num_envs: int,
        num_steps: int,
        fields: dict[str, tuple[tuple[int, ...], Any]],
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
    ) -> None:
        if num_envs < 1 or num_steps < 1:
            raise ValueError(f"num_envs and num_steps must be positive, got {num_envs} and {num_steps}")
        self.num_envs, self.num_steps = num_envs, num_steps
        shape = (num_steps, num_envs)
        self.data = {name: np.zeros((*shape, *s), dtype=d) for name, (s, d) in fields.items()}
        self.last = {name: np.zeros((num_envs, *s), dtype=d) for name, (s, d) in fields.items()}
        self.rewards = np.zeros(shape, dtype=np.float64)
        self.terminations = np.zeros(shape, dtype=bool)
        self.truncations = np.zeros(shape, dtype=bool)
        self.valid = np.ones(shape, dtype=bool)
        self.filled = np.zeros(num_envs, dtype=np.int64)  # completed transitions per env
        self._pending = np.zeros(num_envs, dtype=bool)  # a step recorded, its outcome not yet
        self._prev_ended = np.zeros(num_envs, dtype=bool)  # the env's last step ended an episode
        mode = parse_autoreset_mode(autoreset_mode, allowed=(AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP))
        self._next_step = mode is AutoresetMode.NEXT_STEP

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    @property
    def full(self) -> bool:
        """Whether every env has ``num_steps`` transitions."""
        return bool((self.filled == self.num_steps).all())

    def record_outcome(
        self, env_ids: np.ndarray, rewards: np.ndarray, terminations: np.ndarray, truncations: np.ndarray
    ) -> None:
        """Complete the pending step of each env in ``env_ids`` with what ``recv`` returned.

        Envs with no pending step (their first batch after ``async_reset``) are skipped.
        """
        ids = np.asarray(env_ids)
        pending = self._pending[ids]
        if not pending.any():
            return
        sel = ids[pending]
        t = self.filled[sel]
        self.rewards[t, sel] = np.asarray(rewards)[pending]
        term = np.asarray(terminations)[pending]
        trunc = np.asarray(truncations)[pending]
        self.terminations[t, sel] = term
        self.truncations[t, sel] = trunc
        if self._next_step:
            self.valid[t, sel] = ~self._prev_ended[sel]
            self._prev_ended[sel] = term | trunc
        self.filled[sel] += 1
        self._pending[sel] = False

    def record_step(self, env_ids: np.ndarray, **fields: np.ndarray) -> np.ndarray:
        """Record the step about to be sent for ``env_ids`` (obs, actions, values, ...).

        Returns a bool mask over ``env_ids``: the envs that still collect (send their actions).
        Envs whose column is full have their fields stored in :attr:`last` instead (the
        bootstrap state) and must not be sent until :meth:`clear`.
        """
        ids = np.asarray(env_ids)
        room = self.filled[ids] < self.num_steps
        for name, value in fields.items():
            value = np.asarray(value)
            if room.any():
                self.data[name][self.filled[ids[room]], ids[room]] = value[room]
            if not room.all():
                self.last[name][ids[~room]] = value[~room]
        self._pending[ids[room]] = True
        return room

    def clear(self) -> np.ndarray:
        """Start the next rollout; return the ids of the envs waiting for actions.

        Each env's next column starts from the state in :attr:`last`: compute the actions for
        it with the updated policy, :meth:`record_step` them and ``send`` them.
        """
        self.filled[:] = 0
        self.valid[:] = True
        self._pending[:] = False
        return np.arange(self.num_envs)
