"""Parameter-sharing PPO on MPE's simple_spread: one policy for every agent, a row per agent.

    python examples/ppo_multiagent.py                     # 300k agent steps, 8 copies x 3 agents
    python examples/ppo_multiagent.py --total-steps 60000 --num-envs 4

The agent, the update and the loop are those of ``examples/ppo_rollout.py``, on a
:class:`shmvec.pettingzoo.MultiAgentVecEnv`: every copy of the
PettingZoo env runs in a worker, and ``envs.rollout(policy, T)`` writes ``[T, copies * agents]``
rows in place. The policy sees one row per agent and acts for each. A transition is real where
``batch["valid"]`` (not the reset step after an episode end) and ``batch["active"]`` (the
row's agent was still in the episode) hold: ``shmvec.rollout_gae`` skips the other rows, and the
update trains on the real ones only.

``--num-envs`` counts copies of the env here. Needs torch and the ``pettingzoo`` extra.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from shmvec.pettingzoo import MultiAgentVecEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling examples, run from anywhere
from ppo_cartpole import Hyperparams, cli  # noqa: E402
from ppo_rollout import _train  # noqa: E402


class SimpleSpread:
    """A picklable factory of MPE's simple_spread (spawned and forkserver workers need one)."""

    def __init__(self, agents: int = 3, max_cycles: int = 25) -> None:
        self.agents, self.max_cycles = agents, max_cycles

    def __call__(self) -> Any:
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(N=self.agents, max_cycles=self.max_cycles)


def train(
    total_steps: int = 300_000,
    num_envs: int = 8,
    seed: int = 1,
    *,
    num_workers: int | None = None,
    progress: bool = True,
    torch_threads: int | None = None,
    **hyperparams: Any,
) -> dict[str, Any]:
    """Train one policy for every agent and return the run's statistics.

    ``total_steps`` counts agent steps; ``num_envs`` copies of the env (3 agents each). The
    returns reported are per agent and episode (simple_spread's reward is mostly shared).
    Statistics as :func:`ppo_rollout.train` (``valid_fraction``: the rows that were real
    transitions).
    """
    # Returns are per agent and episode; 240 of them (10 rounds of 24 rows) make the average.
    settings = {"env_id": "mpe2 simple_spread_v3", "target_return": -20.0, "num_steps": 50, "return_window": 240,
                "ent_coef": 0.0, "learning_rate": 1e-3, **hyperparams}  # fmt: skip
    hp = Hyperparams(**settings)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    envs = MultiAgentVecEnv([SimpleSpread()] * num_envs, num_workers=num_workers)
    try:
        return _train(envs, hp, total_steps, envs.num_envs, seed, progress)  # ppo_rollout's loop, a row per agent
    finally:
        envs.close()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return cli(train, __doc__, argv)


if __name__ == "__main__":
    main()
