"""A package that registers its envs as it is imported, as ``ale_py`` does (tests/test_platforms.py)."""

import gymnasium as gym

COUNT = 40

for i in range(COUNT):
    gym.register(id=f"RegPkg/Env{i}-v0", entry_point="registering_pkg:Env")


class Env(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        return self.observation_space.sample() * 0, 1.0, False, False, {}
