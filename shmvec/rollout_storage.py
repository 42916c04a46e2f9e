"""``RolloutStorage``: the parent's view of a ``[T, N]`` rollout segment, and the batch it hands out.

The workers write observations, rewards and flags into the rollout segment row by row
(:class:`~shmvec.layout.RolloutLayout`); the parent writes each row's actions there and keeps
whatever else the policy returns (log-probabilities, values, ...) in arrays of its own. This
module knows nothing of processes or envs: :mod:`shmvec.rollouts` fills it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.layout import RolloutLayout
from shmvec.stepper import Targets
from shmvec.tree import assemble

__all__ = ["RESERVED", "RolloutStorage", "split_policy_output"]

# The keys of a rollout batch; a policy's extras may not use them.
RESERVED = frozenset(
    {"obs", "actions", "rewards", "terminations", "truncations", "next_obs", "valid", "final_obs", "infos"}
)


def split_policy_output(out: Any, action_space: spaces.Space) -> tuple[Any, dict[str, Any]]:
    """``actions`` or ``(actions, extras)`` from a policy, as ``(actions, extras)``.

    A 2-tuple whose second item is a dict is ``(actions, extras)``; with a Tuple action space
    (whose actions are tuples themselves) only when its first item is a tuple too.
    """
    if (
        isinstance(out, tuple)
        and len(out) == 2
        and isinstance(out[1], dict)
        and (not isinstance(action_space, spaces.Tuple) or isinstance(out[0], tuple))
    ):
        return out[0], out[1]
    return out, {}


class RolloutStorage:
    """Views of one rollout segment, per row, plus the parent-side arrays of policy extras.

    Parameters
    ----------
    layout : RolloutLayout
    views : dict of ndarray
        ``layout.views(buffer)`` in the parent.
    observation_space, action_space : gymnasium.Space
        The single (per-env) spaces.
    next_step : bool
        Under NEXT_STEP autoreset the batch carries a ``valid`` mask.
    """

    def __init__(
        self,
        layout: RolloutLayout,
        views: dict[str, np.ndarray],
        observation_space: spaces.Space,
        action_space: spaces.Space,
        next_step: bool,
    ) -> None:
        self.layout = layout
        self.num_steps, self.num_envs = layout.num_steps, layout.num_envs
        self.observation_space, self.action_space = observation_space, action_space
        self.obs = layout.leaf_views(views, "obs")  # [T + 1, N, ...] each
        self.act = layout.leaf_views(views, "act")  # [T, N, ...] each
        self.final_obs = layout.leaf_views(views, "final_obs") if layout.with_final_obs else []
        self.rewards, self.terminations, self.truncations = (
            views["rewards"],
            views["terminations"],
            views["truncations"],
        )
        T = self.num_steps
        # What the policy sees at row t: views of the storage itself, built once (writable, so
        # that torch.from_numpy takes them without a copy or a warning).
        self.policy_obs = [assemble(observation_space, [o[t] for o in self.obs]) for t in range(T)]
        self.act_rows = [[a[t] for a in self.act] for t in range(T)]
        # Where step t reads its actions and writes its results, for all envs.
        self.rows = [
            Targets(
                [o[t + 1] for o in self.obs],
                [f[t] for f in self.final_obs],
                self.act_rows[t],
                self.rewards[t],
                self.terminations[t],
                self.truncations[t],
            )
            for t in range(T)
        ]
        self.valid = np.ones((T, self.num_envs), dtype=bool) if next_step else None
        self.extras: dict[str, np.ndarray] = {}
        self.infos: list[dict[str, Any]] = [{} for _ in range(T)]
        self.rows_done = 0  # rows the current rollout has written (all of them once it finished)

    def start(self, current_obs: list[np.ndarray], pending_reset: np.ndarray) -> None:
        """Begin a rollout from ``current_obs`` (per-leaf ``[N, ...]``); ``pending_reset``: the
        envs whose first step will be a NEXT_STEP reset.
        """
        for leaf, cur in zip(self.obs, current_obs):
            np.copyto(leaf[0], cur)
        if self.valid is not None:
            self.valid[0] = ~pending_reset
        self.infos = [{} for _ in range(self.num_steps)]
        self.rows_done = 0

    def record_extras(self, t: int, extras: dict[str, Any]) -> None:
        """Store row ``t`` of each extra the policy returned (``[N, ...]`` each).

        Arrays are allocated at step 0 from what the policy returned (and reused by the next
        rollout when the shapes match); later steps must return the same names, shapes and dtypes.
        """
        n = self.num_envs
        if t == 0:
            clash = RESERVED & extras.keys()
            if clash:
                raise ValueError(f"policy extras {sorted(clash)} clash with the rollout's own keys: rename them")
            kept = {k: v for k, v in self.extras.items() if k in extras}
            self.extras = kept
        elif extras.keys() != self.extras.keys():
            raise ValueError(
                f"the policy returned extras {sorted(extras)} at step {t}, but {sorted(self.extras)} "
                "at step 0: every step must return the same ones"
            )
        for name, value in extras.items():
            a = np.asarray(value)
            store = self.extras.get(name)
            if store is None or store.shape[1:] != a.shape or store.dtype != a.dtype:
                if t != 0 or a.ndim == 0 or a.shape[0] != n:
                    raise ValueError(
                        f"policy extra {name!r} has shape {a.shape} dtype {a.dtype} at step {t}; expected "
                        + (
                            f"({n}, ...): one row per env"
                            if store is None
                            else f"{store.shape[1:]} dtype {store.dtype} as at step 0"
                        )
                    )
                store = self.extras[name] = np.empty((self.num_steps, *a.shape), dtype=a.dtype)
            store[t] = a

    def finish(self, restarted: list[tuple[int, Sequence[int]]]) -> None:
        """Complete the ``valid`` mask once every row is written.

        Under NEXT_STEP the step after an episode end is a reset (its action ignored), except
        after a restart (``(t, envs)`` pairs), whose step is a normal one.
        """
        if self.valid is None:
            return
        ended = self.terminations[:-1] | self.truncations[:-1]
        np.logical_not(ended, out=self.valid[1:])
        for t, envs in restarted:
            if t + 1 < self.num_steps:
                self.valid[t + 1, envs] = True

    def next_obs(self) -> list[np.ndarray]:
        """Per-leaf views of the observation after the last step (row ``T``)."""
        return [o[self.num_steps] for o in self.obs]

    def batch(self) -> dict[str, Any]:
        """The rollout as a dict of ``[T, N, ...]`` arrays (views, valid until the next rollout)."""
        T = self.num_steps
        out: dict[str, Any] = {
            "obs": assemble(self.observation_space, [o[:T] for o in self.obs]),
            "actions": assemble(self.action_space, list(self.act)),
            "rewards": self.rewards,
            "terminations": self.terminations,
            "truncations": self.truncations,
            "next_obs": assemble(self.observation_space, self.next_obs()),
        }
        if self.valid is not None:
            out["valid"] = self.valid
        if self.final_obs:
            out["final_obs"] = assemble(self.observation_space, list(self.final_obs))
        out.update(self.extras)
        out["infos"] = self.infos
        return out
