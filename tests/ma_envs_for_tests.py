"""Small PettingZoo parallel envs for the multi-agent tests."""

from __future__ import annotations

import os
import time

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class LeavingAgents(ParallelEnv):
    """KAZ-style: agents leave the episode one by one, at times drawn at reset; the ones still
    there are truncated at ``max_cycles``. Observations depend on the actions taken; some steps
    carry per-agent infos; rewards depend on the env's random generator (seeding matters).

    ``fault`` (``"raise"``, ``"exit"``, ``"hang"``) misbehaves at step ``at`` of the first episode.
    """

    metadata = {"name": "leaving_agents_v0", "render_modes": ["rgb_array"]}

    def __init__(self, num_agents: int = 3, max_cycles: int = 9, fault: str = "none", at: int = 3,
                 render_mode: str | None = None) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.max_cycles = max_cycles
        self.fault, self.at = fault, at
        self.render_mode = render_mode
        self.episodes = 0
        self._obs_space = spaces.Box(-100.0, 100.0, shape=(3,), dtype=np.float32)
        self._act_space = spaces.Discrete(3)
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self.episodes += 1
        self.lifetime = {a: int(self.rng.integers(2, self.max_cycles + 3)) for a in self.agents}
        self.state = {a: np.full(3, i, dtype=np.float32) for i, a in enumerate(self.agents)}
        infos = {a: ({"start": i} if i % 2 == 0 else {}) for i, a in enumerate(self.agents)}
        return {a: self.state[a].copy() for a in self.agents}, infos

    def step(self, actions):
        self.t += 1
        if self.episodes == 1 and self.t == self.at:
            if self.fault == "raise":
                raise ZeroDivisionError("multi-agent step exploded")
            if self.fault == "exit":
                os._exit(3)
            if self.fault == "hang":
                time.sleep(3600)
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            self.state[a] = (self.state[a] + np.float32(actions[a]) - 1.0).astype(np.float32)
            obs[a] = self.state[a].copy()
            rewards[a] = float(actions[a]) * 0.5 + float(self.rng.normal())
            terms[a] = self.t >= self.lifetime[a]
            truncs[a] = not terms[a] and self.t >= self.max_cycles
            infos[a] = {"t": self.t, "hp": float(self.lifetime[a] - self.t)} if self.t % 3 == 0 else {}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def render(self):
        return np.full((2, 2, 3), self.t, dtype=np.uint8)

    def close(self):
        pass


class MixedSpaces(LeavingAgents):
    """Agent 1 sees more than the others: not a parameter-sharing env without padding."""

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, shape=(5 if agent == "agent_1" else 3,), dtype=np.float32)
