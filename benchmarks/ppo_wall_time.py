"""Wall time of whole PPO runs: the same run on a baseline vector env and on shmvec.

    python benchmarks/ppo_wall_time.py                    # 50k steps, 8 envs, seed 0
    python benchmarks/ppo_wall_time.py --total-steps 20000
    python benchmarks/ppo_wall_time.py --json benchmarks/results-2core/ppo_wall_time.json  # what the docs quote

Two pairs, each the same code, seed and number of steps, only the vector env differs:

* SB3's PPO (``examples/sb3_ppo.py``): SB3's ``SubprocVecEnv`` against
  ``shmvec.sb3.SubprocVecEnv``, each with its defaults; SB3's default start method,
  ``forkserver``, imports torch again in every worker, so SB3 is also run with ``fork``, which
  separates that start-up cost from the stepping;
* the CleanRL-style loop (``examples/ppo_cartpole.py``): Gymnasium's ``AsyncVectorEnv``
  against ``shmvec.ShmVecEnv``, both with SAME_STEP autoreset.

Both pairs must produce the same training (same returns): the "same run" column checks it. The
wall time includes starting the vector env. Prints a markdown table; :func:`run` returns the
rows. Needs SB3 and torch (the ``dev`` or ``sb3`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shmvec.bench.output import write_study

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    """Import ``examples/<name>.py`` as a module (examples/ is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _async_vector_env(env_fns, autoreset_mode):
    import gymnasium as gym

    return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)


def run(total_steps: int = 50_000, num_envs: int = 8, seed: int = 0, verbose: bool = True) -> list[dict[str, Any]]:
    """Run both pairs; one row per pair.

    Returns
    -------
    list of dict
        ``loop``, ``baseline``, ``baseline_s``, ``shmvec_s``, ``speedup``
        (``baseline_s / shmvec_s``), ``same_run`` and ``steps``.
    """
    from stable_baselines3.common.vec_env import SubprocVecEnv as SB3SubprocVecEnv

    from shmvec.sb3 import SubprocVecEnv

    sb3_ppo, cleanrl_ppo = _example("sb3_ppo"), _example("ppo_cartpole")

    def say(msg: str) -> None:
        if verbose:
            print(msg, file=sys.stderr, flush=True)

    rows = []
    say(f"SB3 PPO, {total_steps:,} steps, {num_envs} envs: shmvec.sb3.SubprocVecEnv ...")
    ours = sb3_ppo.train(total_steps, num_envs, seed, vec_env_cls=SubprocVecEnv, eval_episodes=0)
    for label, kwargs in (("SB3 SubprocVecEnv (forkserver, its default)", None),
                          ("SB3 SubprocVecEnv (fork)", {"start_method": "fork"})):  # fmt: skip
        say(f"SB3 PPO: {label} ...")
        base = sb3_ppo.train(total_steps, num_envs, seed, vec_env_cls=SB3SubprocVecEnv, vec_env_kwargs=kwargs,
                             eval_episodes=0)  # fmt: skip
        rows.append(_row("SB3 PPO", label, base, ours, base["train_return"] == ours["train_return"]))

    say("CleanRL-style PPO: Gymnasium AsyncVectorEnv ...")
    base = cleanrl_ppo.train(total_steps, num_envs, seed, make_vector_env=_async_vector_env, progress=False)
    say("CleanRL-style PPO: shmvec.ShmVecEnv ...")
    ours = cleanrl_ppo.train(total_steps, num_envs, seed, progress=False)
    rows.append(_row("CleanRL-style PPO", "Gymnasium AsyncVectorEnv", base, ours, base["history"] == ours["history"]))
    return rows


def _row(loop: str, baseline: str, base: dict, ours: dict, same: bool) -> dict[str, Any]:
    return {
        "loop": loop,
        "baseline": baseline,
        "steps": ours["steps"],
        "baseline_s": base["wall_time_s"],
        "shmvec_s": ours["wall_time_s"],
        "speedup": base["wall_time_s"] / ours["wall_time_s"],
        "same_run": same,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| loop | baseline | steps | baseline (s) | shmvec (s) | baseline / shmvec | same run |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loop']} | {r['baseline']} | {r['steps']:,} | {r['baseline_s']:.1f} | {r['shmvec_s']:.1f} "
            f"| {r['speedup']:.2f}x | {'yes' if r['same_run'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=50_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the rows here (docs/migration.md quotes such a file)")
    args = parser.parse_args(argv)
    rows = run(args.total_steps, args.num_envs, args.seed)
    print(format_table(rows))
    if args.json:
        write_study(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
