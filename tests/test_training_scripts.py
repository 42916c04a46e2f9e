"""The training scripts in examples/training/ run to the end on shmvec, as their users run them
(defaults: nothing about torch or shmvec is set), and log the episodes they finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
SCRIPTS = os.path.join(HERE, os.pardir, "examples", "training")


def run_script(name: str, *args: str) -> tuple[str, dict]:
    """Run a script as a user does (its own process); its output and its closing summary."""
    out = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, name), *args], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, json.loads(out.stdout.strip().splitlines()[-1])


def test_continuous_ppo_runs_on_shmvec_and_logs_episodes():
    pytest.importorskip("mujoco", reason="mujoco is in the dev extra: make test installs it")
    stdout, summary = run_script(
        "ppo_continuous.py", "--num-envs", "2", "--num-steps", "512", "--total-timesteps", "2048",
        "--num-minibatches", "4", "--update-epochs", "1",
    )  # fmt: skip
    # HalfCheetah's episodes end at its 1000-step limit: each of the 2 envs finishes one.
    assert summary["steps"] == 2048 and summary["episodes"] == 2
    assert stdout.count("episodic_return=") == 2
    assert len(summary["iterations"]) == 2


def test_discrete_ppo_runs_on_shmvec_and_logs_episodes():
    stdout, summary = run_script("ppo_discrete.py", "--num-envs", "4", "--num-steps", "128", "--total-timesteps", "1024")
    assert summary["steps"] == 1024 and summary["episodes"] > 0
    assert stdout.count("episodic_return=") == summary["episodes"]
    assert len(summary["iterations"]) == 2


def test_atari_ppo_runs_on_shmvec_and_logs_episodes():
    pytest.importorskip("ale_py", reason="ale-py is in the dev extra: make test installs it")
    stdout, summary = run_script(
        "ppo_atari.py", "--num-envs", "2", "--num-steps", "400", "--total-timesteps", "800", "--update-epochs", "1",
    )  # fmt: skip
    assert summary["steps"] == 800 and summary["episodes"] > 0
    assert stdout.count("episodic_return=") == summary["episodes"]


def test_sb3_ppo_runs_on_shmvec_and_logs_episodes():
    pytest.importorskip("stable_baselines3", reason="SB3 is in the dev extra: make test installs it")
    pytest.importorskip("mujoco", reason="mujoco is in the dev extra: make test installs it")
    stdout, summary = run_script("sb3_ppo.py", "--num-envs", "2", "--n-steps", "512", "--total-timesteps", "2048")
    assert summary["steps"] == 2048 and summary["episodes"] == 2  # HalfCheetah's 1000-step limit, per env
    assert stdout.count("episodic_return=") == 2
    assert len(summary["iterations"]) == 2
