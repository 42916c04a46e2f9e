"""The loop of ``ShmVecEnv.rollout``: ``T`` synchronous rounds, each written straight into rollout storage.

Row ``t`` of a :class:`~shmvec.storage.RolloutStorage` holds what the policy saw and did, and
what the envs answered: the policy runs on the row's observations, its actions are written
into the row, and one command round makes every block step into that row (the workers write
the next row's observations). What a round needs of the vector env comes in as
:class:`RowRound`, so this module knows nothing of the env class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from shmvec.checks import positive_int
from shmvec.storage import RolloutStorage, split_policy_output
from shmvec.tree import pickled_fields

__all__ = ["RowRound", "check_rollout", "fill"]


class RowRound(Protocol):
    """What the loop needs of a vector env, one row at a time."""

    def write_actions(self, t: int, actions: Any) -> None:
        """Check ``actions`` and write them into row ``t`` (``ValueError`` leaves nothing written)."""

    def step_row(self, t: int) -> tuple[dict[str, Any], Sequence[int]]:
        """Step every env into row ``t``; ``(infos, envs restarted in this step)``."""


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
    rounds: RowRound,
    action_space: spaces.Space,
) -> None:
    """Fill every row of ``storage``. An error stops the loop: the rows before it
    (``storage.rows_done``) hold valid steps, and the envs continue from there.
    """
    restarted: list[tuple[int, Sequence[int]]] = []
    for t in range(storage.num_steps):
        actions, extras = split_policy_output(policy(storage.policy_obs[t]), action_space)
        rounds.write_actions(t, actions)
        storage.record_extras(t, extras)
        infos, envs = rounds.step_row(t)
        storage.rows_done = t + 1
        if envs:
            restarted.append((t, envs))
        if infos:
            storage.infos[t] = infos
    storage.finish(restarted)
