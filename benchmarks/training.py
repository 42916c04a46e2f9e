"""Training speed of the scripts in examples/training/ on each vector env, as users run them.

Each run is the script in its own process, at its defaults (nothing about torch or shmvec is
set), with only ``--vec`` changed. Rounds are paired: every engine runs once per round, in a
rotated order, and each figure is a ratio over SyncVectorEnv in the same round; the report
gives the median over rounds. A run's speed is its steady state: the iterations after the first
two (the first compiles and warms up; shmvec lowers torch's threads from the third rollout on,
once it has seen two of the same length), collection plus update, and the update alone, so that
a gain in collection bought with a slower update shows.

    python benchmarks/training.py --json benchmarks/results-2core/training.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parent / "examples" / "training"
WARMUP_ITERATIONS = 2

# study -> (the script, its arguments for a short run, the engines to compare: the first is the reference)
STUDIES = {
    "ppo_continuous": (
        "ppo_continuous.py",
        ["--total-timesteps", "14336", "--num-steps", "256"],
        ["sync", "shmvec", "shmvec-torch-untouched", "async"],
    ),
    "ppo_atari": (
        "ppo_atari.py",
        ["--total-timesteps", "5120", "--num-steps", "128"],
        ["sync", "shmvec", "shmvec-torch-untouched", "async"],
    ),
    "sb3_ppo": (
        "sb3_ppo.py",
        ["--total-timesteps", "12288", "--n-steps", "256"],
        ["dummy", "shmvec", "subproc"],
    ),
    "ppo_discrete_x4": (
        "ppo_discrete.py",
        ["--total-timesteps", "4096", "--num-envs", "4"],
        ["sync", "shmvec", "shmvec-torch-untouched", "async"],
    ),
    "ppo_discrete_x16": (
        "ppo_discrete.py",
        ["--total-timesteps", "16384", "--num-envs", "16"],
        ["sync", "shmvec", "shmvec-torch-untouched", "async"],
    ),
}


def run(script: str, args: list[str], engine: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--vec", engine, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} --vec {engine} failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    steady = summary["iterations"][WARMUP_ITERATIONS:] or summary["iterations"]
    collect = statistics.median(c for c, _ in steady)
    update = statistics.median(u for _, u in steady)
    return {"steady_sps": summary["batch"] / (collect + update), "collect_s": collect, "update_s": update}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def study(name: str, rounds: int, only: list[str] | None = None) -> dict:
    script, args, engines = STUDIES[name]
    if only:
        engines = [e for i, e in enumerate(engines) if i == 0 or e in only]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(rounds):
        order = engines[r % len(engines) :] + engines[: r % len(engines)]
        for engine in order:
            runs[engine].append(run(script, args, engine))
            print(f"{name} round {r + 1}/{rounds} {engine}: {runs[engine][-1]}", file=sys.stderr)
    ref = engines[0]
    ratios = {}
    for engine in engines[1:]:
        pairs = list(zip(runs[engine], runs[ref]))
        ratios[engine] = {
            "sps": spread([a["steady_sps"] / b["steady_sps"] for a, b in pairs]),
            "collect": spread([b["collect_s"] / a["collect_s"] for a, b in pairs]),  # speed of collection
            "update_time": spread([a["update_s"] / b["update_s"] for a, b in pairs]),  # > 1: a slower update
        }
    return {"script": script, "args": args, "reference": ref, "rounds": rounds, "runs": runs, "over_reference": ratios}


def markdown(results: dict) -> str:
    """The report's section: per study, each engine's training speed, collection speed and update
    time over the study's reference (medians of the paired rounds, and their range)."""
    lines = [
        f"## Training scripts ({results['cores']} cores)",
        "",
        "Steady-state training steps/s of each script in `examples/training/` at its defaults, over the",
        "first engine of its row group, medians (and ranges) of paired rounds; update time above 1x means",
        "a slower update.",
        "",
        "| study | engine | training | collection | update time |",
        "|---|---|---:|---:|---:|",
    ]
    for name, found in results["studies"].items():
        for engine, r in found["over_reference"].items():
            cells = [f"{r[k]['median']:.2f}x ({r[k]['min']:.2f}-{r[k]['max']:.2f})" for k in ("sps", "collect", "update_time")]
            lines.append(f"| {name} over {found['reference']} | {engine} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", default=",".join(STUDIES), help="comma-separated, from: " + ", ".join(STUDIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engines", help="comma-separated: only these of each study's engines (its reference always runs)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--append-to", metavar="MD", help="append the markdown section to this report (make bench's)")
    a = p.parse_args(argv)
    results = {"cores": len(os.sched_getaffinity(0)), "studies": {}}
    for name in a.studies.split(","):
        found = results["studies"][name] = study(name, a.rounds, a.engines.split(",") if a.engines else None)
        for engine, r in found["over_reference"].items():
            print(
                f"{name:18s} {engine:24s} training x{r['sps']['median']:.2f} "
                f"(collection x{r['collect']['median']:.2f}, update time x{r['update_time']['median']:.2f}) "
                f"over {found['reference']}"
            )
    if a.json:
        from shmvec.bench.output import write_study

        write_study(a.json, results)
    section = markdown(results)
    print(section)
    if a.append_to:
        with open(a.append_to, "a", encoding="utf-8") as report:
            report.write("\n" + section)


if __name__ == "__main__":
    main()
