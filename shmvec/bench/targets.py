"""The throughput targets shmvec sets itself, checked against the ratios measured in a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shmvec.bench.engines import CEILING

if TYPE_CHECKING:
    from shmvec.bench.sweep import SweepResult

__all__ = ["TARGETS", "Outcome", "Target", "evaluate"]


@dataclass(frozen=True)
class Target:
    """``shmvec steps/s >= min_ratio x peer steps/s`` (``> min_ratio`` when ``strict``).

    ``num_envs=None`` checks every size measured; ``peer=None`` checks every other engine.
    The worst ratio found is the one reported. A ratio is the median of the per-round ratios
    where both engines took their windows in turn (reported with their spread).
    """

    text: str
    workload: str
    num_envs: int | None
    peer: str | None
    min_ratio: float
    strict: bool = False
    engine: str = "shmvec"

    def holds(self, ratio: float) -> bool:
        return ratio > self.min_ratio if self.strict else ratio >= self.min_ratio


@dataclass(frozen=True)
class Outcome:
    """A target checked: ``status`` is ``"met"``, ``"missed"`` or ``"not measured"``."""

    target: Target
    status: str
    ratio: float | None
    detail: str


# Set for shmvec at its defaults (every env in a worker) with 2 workers on 2 cores (the report says
# how many it measured with).
TARGETS: list[Target] = [
    Target("Atari-like at 128 envs: >= 3x gym SyncVectorEnv", "atari-like", 128, "gym-sync", 3.0),
    Target(
        "Atari-like at 128 envs: >= 20x gym AsyncVectorEnv(shared_memory=True)",
        "atari-like",
        128,
        "gym-async-shm",
        20.0,
    ),
    Target("100 us env at 32 envs: >= 1.8x the serial loop", "cost-100us", 32, "serial", 1.8),
    Target("heavy-tail env: ahead of every other engine, at every size", "heavy-tail", None, None, 1.0, strict=True),
    # Async against sync step with the same envs and workers (every block in a worker).
    Target(
        "heavy-tail env at 32 envs: async (batch_size 16) >= 1.3x sync step, same workers",
        "heavy-tail",
        32,
        "shmvec",
        1.3,
        engine="shmvec-async",
    ),
    Target(
        "CartPole: async no slower than sync step with the same workers, at every size",
        "cartpole",
        None,
        "shmvec",
        1.0,
        engine="shmvec-async",
    ),
    # Rollouts written in place against the step loop a PPO user writes, same envs and workers.
    Target(
        "CartPole: rollout() faster than a step loop filling [T, N] buffers, at every size",
        "cartpole",
        None,
        "shmvec-loop",
        1.0,
        strict=True,
        engine="shmvec-rollout",
    ),
    Target(
        "Atari-like: rollout() faster than a step loop filling [T, N] buffers, at every size",
        "atari-like",
        None,
        "shmvec-loop",
        1.0,
        strict=True,
        engine="shmvec-rollout",
    ),
    # Against this machine's ceiling (split serial: num_workers processes that never talk), measured
    # in the same rounds: what a 2-core VM delivers moves from minute to minute, these ratios much less.
    Target("CartPole at 32 envs: >= 0.75x the ceiling (split serial)", "cartpole", 32, CEILING, 0.75),
    Target("CartPole at 128 envs: >= 0.85x the ceiling (split serial)", "cartpole", 128, CEILING, 0.85),
    Target(
        "Atari-like at 128 envs: rollout() >= 0.8x the ceiling (split serial)",
        "atari-like",
        128,
        CEILING,
        0.8,
        engine="shmvec-rollout",
    ),
    Target("Atari Pong at 16 envs: >= 0.9x the ceiling (split serial)", "atari-pong", 16, CEILING, 0.9),
    Target(
        "Atari Pong at 16 envs: >= 1.5x gym AsyncVectorEnv(shared_memory=True)", "atari-pong", 16, "gym-async-shm", 1.5
    ),
    Target("MuJoCo Ant at 16 envs: >= 0.9x the ceiling (split serial)", "mujoco-ant", 16, CEILING, 0.9),
    Target("CartPole at 32 envs: >= 10x gym AsyncVectorEnv(shared_memory=True)", "cartpole", 32, "gym-async-shm", 10.0),
    # Multi-agent: a row per agent (MultiAgentVecEnv) against SuperSuit's vectorization, the
    # route of PettingZoo's own tutorials.
    Target("MPE simple_spread at 16 copies: >= 0.9x the ceiling (split serial)", "mpe-simple-spread", 16, CEILING, 0.9),
    Target(
        "MPE simple_spread at 16 copies: >= 1.3x SuperSuit concat_vec_envs_v1 multiprocessing",
        "mpe-simple-spread",
        16,
        "supersuit-mp",
        1.3,
    ),
]


def evaluate(sweep: SweepResult, targets: list[Target] | None = None) -> list[Outcome]:
    """Check each target against ``sweep``'s measured ratios."""
    return [_check(sweep, t) for t in (TARGETS if targets is None else targets)]


def _check(sweep: SweepResult, t: Target) -> Outcome:
    sizes = sweep.sizes(t.workload) if t.num_envs is None else [t.num_envs]
    # "Every other engine" means the peers: shmvec's own modes are not its competition.
    peers = [e for e in sweep.engines() if not e.startswith("shmvec") and e != CEILING] if t.peer is None else [t.peer]
    pairs = []
    for n in sizes:
        for peer in peers:
            ratio = sweep.ratio(t.workload, n, t.engine, peer)
            if ratio is not None:
                pairs.append((ratio, n, peer))
    if not pairs:
        why = "not measured in this run"
        r = sweep.get(t.workload, sizes[0], t.engine) if sizes else None
        if r is not None and not r.ok:
            why = f"{sweep.engine_label(t.engine)} {r.status}: {r.reason}"
        elif t.peer is not None and sizes:
            r = sweep.get(t.workload, sizes[0], t.peer)
            if r is not None and not r.ok:
                why = f"{sweep.engine_label(t.peer)} {r.status}: {r.reason}"
        return Outcome(t, "not measured", None, why)
    ratio, n, peer = min(pairs)
    status = "met" if t.holds(ratio) else "missed"
    rounds = sweep.round_ratios(t.workload, n, t.engine, peer)
    spread = f", rounds {min(rounds):.2f}-{max(rounds):.2f}" if len(rounds) > 1 else ""
    if t.peer is None or t.num_envs is None:
        detail = f"worst: {ratio:.2f}x vs {sweep.engine_label(peer)} at {n} envs ({len(pairs)} pairs{spread})"
    else:
        detail = f"{ratio:.2f}x (median of {len(rounds)} rounds{spread})" if rounds else f"{ratio:.2f}x"
    return Outcome(t, status, ratio, detail)
