"""Every Python block of README.md and docs/*.md runs as written (at small sizes), or says why not.

The blocks of one page run in order, in one namespace, in a fresh process. A page's blocks may use
the names of :data:`TOOLBOX` (CartPole factories, a policy, a value function, ...) where they
leave the user's own parts out. A block that cannot run says so in an HTML comment on the line
above it: ``<!-- not run: <the reason> -->``. Sizes that only cost time are shrunk
(:data:`SHRINK`): the code path is the same.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>[^\n]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)

# What the pages leave to the reader, at small sizes.
TOOLBOX = '''
import numpy as np, gymnasium as gym, shmvec

def make_env():
    return gym.make("CartPole-v1")

env_fns = [make_env] * 32
num_envs, steps, T, N = 32, 3, 8, 8
actions = [0, 1] * 4

def policy(obs):
    """CartPole actions from numpy or torch observations (a torch policy returns tensors)."""
    return (obs[:, 2] > 0).long() if hasattr(obs, "long") else (np.asarray(obs)[:, 2] > 0).astype(np.int64)

def agent(obs):
    obs = np.asarray(obs)
    actions = (obs[:, 2] > 0).astype(np.int64)
    return actions, np.zeros(len(obs), np.float32), obs[:, 0].astype(np.float32)

def value_fn(obs):
    obs = np.asarray(obs, np.float32)
    return obs.reshape(len(obs), -1)[:, 0] if len(obs) else np.zeros(0, np.float32)

value_of = critic = value_fn
actor = policy

def update(*arrays):
    pass

def _fresh_envs():
    envs = shmvec.make("CartPole-v1", num_envs=8, num_workers=2)
    envs.reset(seed=0)
    return envs
'''

# Sizes that only cost time, and what the test runs instead.
SHRINK = [
    (r"learn\(100_000\)", "learn(256)"),
    (r"total_timesteps=100_000", "total_timesteps=256"),
    (r"range\(1000\)", "range(20)"),
    # SB3's PPO collects n_steps (2048) per env before its first update, whatever total_timesteps says.
    (r'PPO\("MlpPolicy", (\w+)\)', r'PPO("MlpPolicy", \1, n_steps=16, batch_size=16, n_epochs=1)'),
]

DRIVER = '''
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
exec(compile(blocks["toolbox"], "toolbox", "exec"), ns)
for where, code in blocks["code"]:
    envs = ns.get("envs")
    if "envs" in code and "envs =" not in code.split("envs.")[0] and (envs is None or getattr(envs, "closed", False)):
        ns["envs"] = ns["_fresh_envs"]()  # a block that uses the envs of its page, which an earlier one closed
    try:
        exec(compile(code, where, "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print("FAILED BLOCK", where)
        sys.exit(1)
print("ALL BLOCKS RAN")
'''


def blocks(page: Path) -> list[tuple[int, str | None, str]]:
    """``(line, reason not run or None, code)`` of each Python block of ``page``."""
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group("reason"), m.group("code")) for m in BLOCK.finditer(text)]


def test_every_block_is_found_and_each_skip_gives_a_reason():
    total = sum(page.read_text().count("```python") for page in PAGES)
    found = [b for page in PAGES for b in blocks(page)]
    assert len(found) == total and total > 20
    assert all(reason is None or len(reason) > 20 for _, reason, _ in found)


@pytest.mark.parametrize("page", [p for p in PAGES if "```python" in p.read_text()], ids=lambda p: p.name)
def test_the_blocks_of_a_page_run(page, tmp_path):
    code = []
    for line, reason, text in blocks(page):
        if reason is None:
            for pattern, small in SHRINK:
                text = re.sub(pattern, small, text)
            code.append((f"{page.name}:{line}", text))
    if not code:
        pytest.skip(f"{page.name}: every block says why it does not run")  # (none so far)
    payload = json.dumps({"toolbox": TOOLBOX, "code": code})
    out = subprocess.run([sys.executable, "-c", DRIVER], input=payload, capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0 and "ALL BLOCKS RAN" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
