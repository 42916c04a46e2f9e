"""``ShmVecEnv.rollout``: ``T`` synchronous rounds, each written straight into rollout storage.

Row ``t`` of a :class:`~shmvec.rollout_storage.RolloutStorage` holds what the policy saw and did, and
what the envs answered: the policy runs on the row's observations, its actions are written
into the row, and one step round of the :class:`~shmvec.session.Session` makes every block
step into that row (the workers write the next row's observations).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from shmvec.checks import positive_int
from shmvec.protocol import Command
from shmvec.rollout_storage import RolloutStorage, split_policy_output
from shmvec.session import Session
from shmvec.tree import pickled_fields

__all__ = ["Rollouts", "check_rollout", "fill"]


class Rollouts:
    """The rollout part of :class:`~shmvec.ShmVecEnv`'s API (a base class of it)."""

    _session: Session
    _storage: RolloutStorage | None = None
    single_observation_space: spaces.Space
    single_action_space: spaces.Space
    batch_size: int
    num_envs: int
    autoreset_mode: AutoresetMode

    def rollout(self, policy: Callable[[Any], Any], num_steps: int) -> dict[str, Any]:
        """Step every env ``num_steps`` times with ``policy``; the workers write each step in place.

        ``policy(obs)`` gets the ``[N, ...]`` observations of one step (views of the storage:
        ``torch.from_numpy`` takes them as they are; what the policy writes there, the batch keeps) and
        returns the actions, or ``(actions, extras)`` with ``extras`` a dict of ``[N, ...]``
        arrays to keep per step (log-probabilities, values: anything ``numpy.asarray`` takes,
        e.g. a detached CPU torch tensor). The workers write observations, rewards and flags
        straight into ``[T, N]`` storage in shared memory; the calling process only runs the
        policy. The rollout continues where the last ``step``, ``reset`` or ``rollout`` left
        off (episodes span calls) and is identical, bit for bit, to the same ``step`` loop.

        >>> import numpy as np, shmvec
        >>> envs = shmvec.make("CartPole-v1", num_envs=4, num_workers=2)
        >>> _ = envs.reset(seed=0)
        >>> def policy(obs):
        ...     return (obs[:, 2] > 0).astype(np.int64), {"value": obs[:, 0] * 0.5}
        >>> batch = envs.rollout(policy, num_steps=32)
        >>> batch["obs"].shape, batch["actions"].shape, batch["rewards"].shape, batch["value"].shape
        ((32, 4, 4), (32, 4), (32, 4), (32, 4))
        >>> advantages, returns = shmvec.rollout_gae(batch, last_values=policy(batch["next_obs"])[1]["value"])
        >>> envs.close()

        Parameters
        ----------
        policy : callable
            ``obs -> actions`` or ``obs -> (actions, extras)``. With a Tuple action space, return
            ``(actions, extras)`` with ``actions`` a tuple to pass extras.
        num_steps : int
            Rows ``T`` of the rollout. The storage is allocated on the first call and reused
            while ``num_steps`` stays the same.

        Returns
        -------
        dict
            ``obs`` ``[T, N, ...]`` (what each action was taken on), ``actions``, ``rewards``,
            ``terminations``, ``truncations`` ``[T, N]``, ``next_obs`` ``[N, ...]`` (the
            observation after the last step: ``last_values`` comes from it), each extra
            ``[T, N, ...]``, and ``infos``: one Gymnasium info dict per step. Under NEXT_STEP,
            ``valid`` ``[T, N]``: False on the reset step that follows an episode end (its action
            was ignored), the mask ``shmvec.rollout_gae(batch, ...)`` applies; a
            truncated episode's final observation is the next row's ``obs`` (or ``next_obs``).
            Under SAME_STEP, ``final_obs`` ``[T, N, ...]``: the final observation where step
            ``t`` ended an episode (undefined elsewhere).

            The arrays are views of storage that the next ``rollout`` overwrites: copy what you
            keep longer. They are writable (for in-place reward scaling, say).

        Raises
        ------
        ValueError
            For ``batch_size < num_envs`` or autoreset mode DISABLED, a bad ``num_steps``, or
            actions or extras of the wrong shape (the envs stay usable: a later call continues
            from the last step that ran).
        """
        session = self._session
        session.guard("rollout", sync=False)
        check_rollout(
            policy,
            num_steps,
            self.single_observation_space,
            self.single_action_space,
            self.batch_size,
            self.num_envs,
            self.autoreset_mode,
        )
        session.drain()  # what send() started finishes before row 0 is taken
        segment = session.rollout_segment(num_steps)
        storage = self._storage
        # The storage is always over the segment the blocks hold (a Ctrl-C between the attach
        # round and the line below would otherwise leave the old storage beside the new segment).
        if storage is None or storage.layout is not segment.layout:
            storage = self._storage = RolloutStorage(
                segment.layout,
                segment.views,
                self.single_observation_space,
                self.single_action_space,
                next_step=self.autoreset_mode is AutoresetMode.NEXT_STEP,
            )
        storage.start(session.latest, session.autoreset)
        try:
            fill(storage, policy, session, self.single_action_space)
        finally:
            session.latest = [o[storage.rows_done] for o in storage.obs]
        return storage.batch()


def check_rollout(
    policy: Any,
    num_steps: Any,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    batch_size: int,
    num_envs: int,
    autoreset_mode: AutoresetMode,
) -> None:
    """Refuse, with what to do instead, a rollout that cannot run: variable-size spaces,
    asynchronous collection, autoreset mode DISABLED, a ``policy`` that is not callable, a bad
    ``num_steps``.
    """
    pickled = pickled_fields(observation_space, action_space)
    if pickled:
        raise ValueError(
            f"rollout() keeps every step in shared memory, which cannot hold {', '.join(pickled)}: "
            "its samples have no fixed size. Use step() or send()/recv() for this env."
        )
    if batch_size != num_envs:
        raise ValueError(
            "rollout() steps every env together; this ShmVecEnv collects asynchronously "
            f"(batch_size={batch_size} < num_envs={num_envs}): use shmvec.AsyncRollout"
        )
    if autoreset_mode is AutoresetMode.DISABLED:
        raise ValueError(
            "rollout() needs autoreset_mode NEXT_STEP or SAME_STEP: under DISABLED an env "
            "that ends its episode mid-rollout could not go on"
        )
    positive_int(num_steps, "rollout(num_steps=...)")
    if not callable(policy):
        raise TypeError(f"rollout(policy=...) must be callable (obs -> actions), got {type(policy).__name__}")


def fill(
    storage: RolloutStorage,
    policy: Callable[[Any], Any],
    session: Session,
    action_space: spaces.Space,
) -> None:
    """Fill every row of ``storage``: the policy, then the row's step round (with the step hooks
    around it: the policy runs between them, as between ``step`` calls). An error stops the
    loop: the rows before it (``storage.rows_done``) hold valid steps, and the envs continue
    from there.
    """
    restarted: list[tuple[int, Sequence[int]]] = []
    for t in range(storage.num_steps):
        actions, extras = split_policy_output(policy(storage.policy_obs[t]), action_space)
        storage.record_extras(t, extras)
        infos, envs = session.step(Command.ROLLOUT_STEP, actions, storage.rows[t], t)
        storage.rows_done = t + 1
        if envs:
            restarted.append((t, envs))
        if infos:
            storage.infos[t] = infos
    storage.finish(restarted)
