"""PettingZoo parallel envs, vectorized in shared memory with one row per agent.

>>> from mpe2 import simple_spread_v3
>>> from shmvec.pettingzoo import MultiAgentVecEnv
>>> envs = MultiAgentVecEnv([lambda: simple_spread_v3.parallel_env(N=3)] * 4, num_workers=2)
>>> obs, infos = envs.reset(seed=0)
>>> obs.shape                     # 4 copies x 3 agents
(12, 18)
>>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
>>> rewards.shape, infos["active"].shape
((12,), (12,))
>>> envs.close()

Each copy of the env is wrapped, in its worker, as one Gymnasium env (:class:`AgentRows`)
whose observation holds every agent's row: the agents' observations, rewards, end flags and an
``active`` flag, all in the shared segment. :class:`MultiAgentVecEnv` hands them out as
``[copies * agents, ...]`` arrays (reshaped views, no copy), so a parameter-sharing loop written
for a Gymnasium vector env uses it unchanged. Only command bytes cross the pipes; infos travel
only on steps where an agent reports one. This module imports PettingZoo only to convert an AEC
env; ``import shmvec`` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec.batched_spaces import BatchedSpace
from shmvec.checks import env_factories
from shmvec.infos import add_info
from shmvec.rollout_storage import RESERVED, split_policy_output
from shmvec.tree import assemble, flatten, space_leaves
from shmvec.vector_env import ShmVecEnv

__all__ = ["AgentRows", "MultiAgentVecEnv"]

# Keys of an AgentRows observation besides "obs": the per-agent outcome of the last step.
_OUTCOME = ("reward", "terminated", "truncated", "active")
_AGENT_INFOS = "agent_infos"  # the info key under which AgentRows reports its agents' infos


def _parallel(env: Any) -> Any:
    """``env`` as a PettingZoo ``ParallelEnv`` (an AEC env goes through ``aec_to_parallel``)."""
    if hasattr(env, "agent_iter") and hasattr(env, "last"):
        from pettingzoo.utils.conversions import aec_to_parallel

        return aec_to_parallel(env)
    return env


def agent_spaces(env: Any) -> tuple[list[str], spaces.Space, spaces.Space]:
    """``(possible_agents, observation_space, action_space)`` of a parallel env whose agents all
    share their spaces; a ``ValueError`` naming the agents and spaces that differ otherwise.
    """
    agents = list(env.possible_agents)
    if not agents:
        raise ValueError(f"{type(env).__name__} has no possible_agents")
    for what in ("observation_space", "action_space"):
        space = getattr(env, what)
        first = space(agents[0])
        for agent in agents[1:]:
            other = space(agent)
            if other != first:
                raise ValueError(
                    f"{type(env).__name__}: agent {agent!r} has {what} {other}, but agent {agents[0]!r} has {first}: "
                    "every agent of a MultiAgentVecEnv must share its spaces (pad them first, e.g. with "
                    "SuperSuit's pad_observations_v0 and pad_action_space_v0)"
                )
    return agents, env.observation_space(agents[0]), env.action_space(agents[0])


class AgentRows(gym.Env):
    """One PettingZoo parallel env as a Gymnasium env whose observation holds every agent's row.

    The observation is a Dict: ``obs`` (each agent's observation, ``[A, ...]`` in
    ``possible_agents`` order), ``reward`` (float64), ``terminated``, ``truncated`` and
    ``active`` (bool, ``[A]`` each). An agent that has left the episode keeps a zero observation,
    reward 0 and the end flag it left with; ``active`` is True where the row's observation
    belongs to an agent that acts next. The episode of the copy ends when no agent is left:
    ``terminated`` if any agent terminated, else ``truncated``; the scalar reward is the agents'
    sum. The agents' infos, when any is non-empty, come as ``info["agent_infos"]``: a tuple of
    one dict per agent.

    Parameters
    ----------
    env : pettingzoo.ParallelEnv or pettingzoo.AECEnv
    """

    def __init__(self, env: Any) -> None:
        self.env = _parallel(env)
        self.agents, self.agent_observation_space, self.agent_action_space = agent_spaces(self.env)
        n = len(self.agents)
        self._rows_space = batch_space(self.agent_observation_space, n)
        self.observation_space = spaces.Dict(
            {
                "obs": self._rows_space,
                "reward": spaces.Box(-np.inf, np.inf, (n,), np.float64),
                "terminated": spaces.Box(0, 1, (n,), np.bool_),
                "truncated": spaces.Box(0, 1, (n,), np.bool_),
                "active": spaces.Box(0, 1, (n,), np.bool_),
            }
        )
        self.action_space = batch_space(self.agent_action_space, n)
        self.metadata = dict(getattr(self.env, "metadata", {}))
        self.render_mode = getattr(self.env, "render_mode", None)
        self._leaves = space_leaves(self.agent_observation_space)
        self._flat_obs = len(self._leaves) == 1 and not self._leaves[0].path
        act_leaves = space_leaves(self.agent_action_space)
        self._flat_act = len(act_leaves) == 1 and not act_leaves[0].path
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)

    def _rows(self, obs: dict, rewards: dict | None, live: list[str]) -> dict[str, Any]:
        """The Dict observation of this step: each agent's row, filler for those gone; ``live``:
        the agents still in the episode.
        """
        n = len(self.agents)
        leaves = [np.zeros((n, *leaf.shape), dtype=leaf.dtype) for leaf in self._leaves]
        reward = np.zeros(n, dtype=np.float64)
        flat = self._flat_obs  # one array per agent: no tree to walk
        for j, agent in enumerate(self.agents):
            if agent in obs:
                if flat:
                    leaves[0][j] = obs[agent]
                else:
                    for rows, part in zip(leaves, flatten(self.agent_observation_space, obs[agent])):
                        rows[j] = part
            if rewards is not None and agent in rewards:
                reward[j] = rewards[agent]
        return {
            "obs": leaves[0] if flat else assemble(self._rows_space, leaves),
            "reward": reward,
            "terminated": self._terminated.copy(),
            "truncated": self._truncated.copy(),
            "active": np.array([agent in live for agent in self.agents], dtype=np.bool_),
        }

    def _info(self, infos: dict) -> dict[str, Any]:
        agent_infos = tuple(infos.get(agent) or {} for agent in self.agents)
        return {_AGENT_INFOS: agent_infos} if any(agent_infos) else {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._terminated[:] = False
        self._truncated[:] = False
        return self._rows(obs, None, self.env.agents), self._info(infos or {})

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        before = self.env.agents  # (each look at a wrapped env's agents walks its wrappers)
        if self._flat_act:
            actions = {agent: action[j] for j, agent in enumerate(self.agents) if agent in before}
        else:
            parts = flatten(self.action_space, action)
            actions = {
                agent: assemble(self.agent_action_space, [p[j] for p in parts])
                for j, agent in enumerate(self.agents)
                if agent in before
            }
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        for j, agent in enumerate(self.agents):
            if agent in actions:
                self._terminated[j] = bool(terminations.get(agent, False))
                self._truncated[j] = bool(truncations.get(agent, False))
        live = self.env.agents
        rows = self._rows(obs, rewards, live)
        ended = not live or bool((self._terminated | self._truncated).all())
        terminated = ended and bool(self._terminated.any())
        return rows, float(rows["reward"].sum()), terminated, ended and not terminated, self._info(infos or {})

    @property
    def shmvec_target(self) -> Any:
        """The env that per-env requests reach (:class:`shmvec._adapters.EnvSide`): the PettingZoo one."""
        return self.env

    def _call_inner(self, name: str, args: tuple, kwargs: dict | None) -> Any:
        """Attribute ``name`` of the PettingZoo env: read it (``kwargs`` None), or call it."""
        attr = getattr(self.env, name)
        return attr if kwargs is None or not callable(attr) else attr(*args, **kwargs)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class _AgentRowsFactory:
    """A picklable factory: the user's env factory, wrapped by :class:`AgentRows` in the worker."""

    def __init__(self, env_fn: Callable[[], Any]) -> None:
        self.env_fn = env_fn

    def __call__(self) -> AgentRows:
        return AgentRows(self.env_fn())


class MultiAgentVecEnv(VectorEnv):
    """PettingZoo parallel envs as one Gymnasium vector env with a row per agent.

    Row ``i * A + j`` is agent ``possible_agents[j]`` of copy ``i`` (``A`` agents per copy), so a
    parameter-sharing loop written for a Gymnasium vector env uses it unchanged. Each copy runs
    in a worker of a :class:`~shmvec.ShmVecEnv` (same options, same faults, same guarantees),
    as an :class:`AgentRows` env.

    Rows of agents that left the episode before the others keep a zero observation, reward 0 and
    the end flag they left with; ``infos["active"]`` (and :attr:`active`) says which rows hold an
    observation a live agent acts on. Their actions are ignored (any valid action will do). A
    copy is reset when all its agents are done, under the chosen autoreset mode, with the same
    semantics as single-agent rows: under NEXT_STEP every row of the copy gets its reset
    observation on the next step, with reward 0 and no flag; under SAME_STEP in the same step,
    the final observation of each row in ``infos["final_obs"]``.

    Parameters
    ----------
    env_fns : sequence of callables
        Factories returning PettingZoo ``ParallelEnv`` (or AEC env) copies; all agents must
        share their observation and action spaces.
    copy_wrapper : callable, optional
        ``copy_wrapper(factory, copy_index)`` returns the factory of copy ``copy_index``
        wrapped (``shmvec.sb3`` adds its per-env request handler this way).
    **options
        :class:`~shmvec.ShmVecEnv`'s options (``num_workers``, ``step_in_main``,
        ``autoreset_mode``, ``copy``, ``context``, ``timeout``, ``on_error``, ...), except
        ``batch_size``: copies step together.

    Attributes
    ----------
    num_copies, agents_per_copy : int
    possible_agents : list of str
    vector_env : ShmVecEnv
        The vector env of copies underneath (one env per copy).
    """

    observation_space = BatchedSpace("single_observation_space")
    action_space = BatchedSpace("single_action_space")

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        copy_wrapper: Callable[[Callable[[], Any], int], Callable[[], gym.Env]] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if "batch_size" in options:
            raise TypeError("MultiAgentVecEnv steps every copy together: it takes no batch_size")
        env_fns = env_factories(env_fns, "MultiAgentVecEnv")
        probe = _parallel(env_fns[0]())
        try:
            self.possible_agents, agent_obs, agent_act = agent_spaces(probe)
        finally:
            probe.close()
        factories: list[Callable[[], gym.Env]] = [_AgentRowsFactory(fn) for fn in env_fns]
        if copy_wrapper is not None:
            factories = [copy_wrapper(factory, i) for i, factory in enumerate(factories)]
        self.vector_env = ShmVecEnv(factories, **options)
        venv = self.vector_env
        self.num_copies = venv.num_envs
        self.agents_per_copy = len(self.possible_agents)
        self.num_envs = self.num_copies * self.agents_per_copy
        self.single_observation_space = agent_obs
        self.single_action_space = agent_act
        self.autoreset_mode = venv.autoreset_mode
        self.metadata = dict(venv.metadata)
        self.render_mode = venv.render_mode
        rows_space = venv.single_observation_space
        assert isinstance(rows_space, spaces.Dict)  # AgentRows' observation
        self._rows_space = rows_space["obs"]
        self._copy_act_space = venv.single_action_space
        self._same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        self._active = np.zeros(self.num_envs, dtype=np.bool_)

    # -- rows and copies ---------------------------------------------------------------------
    def _rows(self, batched: Any, space: spaces.Space) -> Any:
        """``[N, A, ...]`` leaves of ``space`` batched per copy, as ``[N * A, ...]`` (views)."""
        return assemble(space, [leaf.reshape(self.num_envs, *leaf.shape[2:]) for leaf in flatten(space, batched)])

    def _copies(self, actions: Any) -> Any:
        """Row actions ``[N * A, ...]`` as the copies' ``[N, A, ...]`` batch (views where they can be)."""
        n, a = self.num_copies, self.agents_per_copy
        leaves = []
        for leaf in flatten(self.single_action_space, actions):
            leaf = np.asarray(leaf)
            if leaf.ndim == 0 or leaf.shape[0] != self.num_envs:
                raise ValueError(
                    f"MultiAgentVecEnv.step: actions must have one row per agent row ({self.num_envs} = "
                    f"{n} copies x {a} agents), got shape {leaf.shape}"
                )
            leaves.append(leaf.reshape(n, a, *leaf.shape[1:]))
        return assemble(self._copy_act_space, leaves)

    def _infos(self, copy_infos: dict[str, Any], active: np.ndarray | None) -> dict[str, Any]:
        """Gymnasium's infos per row, from the copies' infos, in row order; with ``active``
        (``[N, A]``), its rows as ``infos["active"]``, kept as :attr:`active` too.
        """
        n, a = self.num_envs, self.agents_per_copy
        infos: dict[str, Any] = {}
        if copy_infos:
            final_info = copy_infos.get("final_info", {})
            for i in range(self.num_copies):
                if "_final_obs" in copy_infos and copy_infos["_final_obs"][i]:
                    finals = flatten(self._rows_space, copy_infos["final_obs"][i]["obs"])
                    has_info = final_info.get("_" + _AGENT_INFOS)
                    ended = final_info[_AGENT_INFOS][i] if has_info is not None and has_info[i] else None
                    for j in range(a):
                        row_obs = assemble(self.single_observation_space, [leaf[j] for leaf in finals])
                        add_info(infos, {"final_obs": row_obs, "final_info": ended[j] if ended else {}}, i * a + j, n)
                if "_" + _AGENT_INFOS in copy_infos and copy_infos["_" + _AGENT_INFOS][i]:
                    for j, info in enumerate(copy_infos[_AGENT_INFOS][i]):
                        if info:
                            add_info(infos, info, i * a + j, n)
                if "_restarted" in copy_infos and copy_infos["_restarted"][i]:
                    for j in range(a):
                        add_info(infos, {"restarted": bool(copy_infos["restarted"][i])}, i * a + j, n)
        if active is not None:
            self._active[:] = active.reshape(n)
            infos["active"] = self._active.copy()
            infos["_active"] = np.ones(n, dtype=np.bool_)
        return infos

    # -- the VectorEnv API ----------------------------------------------------------------
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every copy (or those whose rows ``options["reset_mask"]`` marks) and return
        ``(obs, infos)`` per row.

        ``seed=int`` seeds copy ``i`` with ``seed + i``; a list gives one seed per copy, or one per
        row (as Gymnasium's vector envs take them), of which each copy takes its first row's.
        """
        if isinstance(seed, Sequence) and len(seed) == self.num_envs and self.agents_per_copy > 1:
            seed = list(seed)[:: self.agents_per_copy]
        if options is not None and "reset_mask" in options:
            options = dict(options)
            options["reset_mask"] = self._copy_mask(options["reset_mask"])
        obs, infos = self.vector_env.reset(seed=seed, options=options)
        return self._rows(obs["obs"], self._rows_space), self._infos(infos, obs["active"])

    def _copy_mask(self, mask: Any) -> np.ndarray:
        mask = np.asarray(mask)
        if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
            raise ValueError(
                f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), one per agent row, "
                f"got {mask.dtype} {mask.shape}"
            )
        per_copy = mask.reshape(self.num_copies, self.agents_per_copy)
        mixed = np.flatnonzero(per_copy.any(axis=1) != per_copy.all(axis=1))
        if mixed.size:
            raise ValueError(
                f"options['reset_mask'] resets copies, not single agents: rows of copy {int(mixed[0])} are "
                "mixed (mark all of a copy's rows or none)"
            )
        return per_copy[:, 0].copy()

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every copy with its agents' rows of ``actions``; returns ``(obs, rewards,
        terminations, truncations, infos)`` per row.
        """
        obs, _, _, _, infos = self.vector_env.step(self._copies(actions))
        outcome = self._outcome(obs, infos)
        return (self._rows(obs["obs"], self._rows_space), *outcome, self._infos(infos, obs["active"]))

    def rollout(self, policy: Callable[[Any], Any], num_steps: int) -> dict[str, Any]:
        """:meth:`ShmVecEnv.rollout <shmvec.ShmVecEnv.rollout>` per agent row: the workers write
        every step in place, ``policy`` sees (and acts for) every row.

        ``policy(obs)`` gets the ``[N * A, ...]`` observations of one step and returns actions
        per row, or ``(actions, extras)`` with extras of ``[N * A, ...]``. The batch has the keys
        of ``ShmVecEnv.rollout`` per row (``obs``, ``actions``, ``rewards``, ``terminations``,
        ``truncations``, ``next_obs``, ``infos``, the extras; ``valid`` under NEXT_STEP,
        ``final_obs`` under SAME_STEP), plus ``active`` ``[T, N * A]``: whether the row's agent
        acted at that step. A transition is real where ``valid`` (NEXT_STEP) and ``active`` hold.
        """
        n, a, rows = self.num_copies, self.agents_per_copy, self.num_envs

        def per_copy(extra: Any) -> np.ndarray:
            extra = np.asarray(extra)
            if extra.ndim == 0 or extra.shape[0] != rows:
                raise ValueError(f"policy extras need one row per agent row ({rows}), got shape {extra.shape}")
            return extra.reshape(n, a, *extra.shape[1:])

        def copy_policy(obs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            actions, extras = split_policy_output(
                policy(self._rows(obs["obs"], self._rows_space)), self.single_action_space
            )
            if "active" in extras:
                raise ValueError("policy extra 'active' clashes with the rollout's own key: rename it")
            return self._copies(actions), {key: per_copy(value) for key, value in extras.items()}

        batch = self.vector_env.rollout(copy_policy, num_steps)
        steps = num_steps

        def per_row(space: spaces.Space | None, batched: Any, single: spaces.Space | None) -> Any:
            return assemble(single, [x.reshape(steps, rows, *x.shape[3:]) for x in flatten(space, batched)])

        obs, last = batch["obs"], batch["next_obs"]
        out: dict[str, Any] = {
            "obs": per_row(self._rows_space, obs["obs"], self.single_observation_space),
            "actions": per_row(self._copy_act_space, batch["actions"], self.single_action_space),
            "next_obs": self._rows(last["obs"], self._rows_space),
            "active": per_row(None, obs["active"], None),
        }
        outcome = [np.empty((steps, rows), dtype=dtype) for dtype in (np.float64, np.bool_, np.bool_)]
        infos = []
        for t in range(steps):
            after = {key: (obs[key][t + 1] if t + 1 < steps else last[key]) for key in _OUTCOME[:3]}
            for o, value in zip(outcome, self._outcome(after, batch["infos"][t])):
                o[t] = value
            infos.append(self._infos(batch["infos"][t], None))
        out["rewards"], out["terminations"], out["truncations"] = outcome
        out["infos"] = infos
        if "valid" in batch:
            out["valid"] = np.repeat(batch["valid"], a, axis=1)
        if "final_obs" in batch:
            out["final_obs"] = per_row(self._rows_space, batch["final_obs"]["obs"], self.single_observation_space)
        for key, value in batch.items():
            if key not in RESERVED:
                out[key] = per_row(None, value, None)
        self._active[:] = last["active"].reshape(rows)
        return out

    def _outcome(self, obs: dict[str, Any], infos: dict[str, Any]) -> list[np.ndarray]:
        """``[rewards, terminations, truncations]`` per row of one step, whose copies' observation
        is ``obs`` and infos ``infos``. A copy reset within the step holds its new episode's first
        rows: its rows' rewards and flags are those of the step that ended it (SAME_STEP: in
        ``final_obs``), or those of a restart (reward 0, truncated).
        """
        n, a = self.num_envs, self.agents_per_copy
        outcome = [obs[key].reshape(n) for key in _OUTCOME[:3]]
        ended, restarted = infos.get("_final_obs"), infos.get("_restarted")
        if ended is None and restarted is None:
            return outcome
        outcome = [o.copy() for o in outcome]
        for i in np.flatnonzero(ended) if ended is not None else ():
            final = infos["final_obs"][i]
            for out, key in zip(outcome, _OUTCOME[:3]):
                out[i * a : (i + 1) * a] = final[key]
        for i in np.flatnonzero(restarted) if restarted is not None else ():
            rows = slice(i * a, (i + 1) * a)
            outcome[0][rows], outcome[1][rows], outcome[2][rows] = 0.0, False, True
        return outcome

    @property  # Gymnasium's is a plain attribute; this one follows the copies'
    def closed(self) -> bool:
        """Whether the vector env is closed (by ``close()``, or by a fault that closed its copies)."""
        venv = self.__dict__.get("vector_env")
        return venv is None or venv.closed

    @closed.setter
    def closed(self, value: bool) -> None:
        pass  # (VectorEnv.close sets it; the copies' vector env holds the truth)

    @property
    def active(self) -> np.ndarray:
        """Rows whose observation (of the last ``reset`` or ``step``) belongs to an agent that
        acts next.
        """
        return self._active.copy()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every copy's PettingZoo env: one result per copy."""
        return self.vector_env.call("_call_inner", name, args, dict(kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every copy's PettingZoo env: one value per copy."""
        return self.vector_env.call("_call_inner", name, (), None)

    def render(self) -> tuple[Any, ...]:
        """Every copy's frame (per its ``render_mode``)."""
        return self.vector_env.render()

    def close_extras(self, **kwargs: Any) -> None:
        self.vector_env.close()

    def __enter__(self) -> MultiAgentVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
