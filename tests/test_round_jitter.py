"""The round under jitter and chaos, briefly (``make stress`` runs it for minutes): random sleeps
and yields at every probe point of both sides (``SHMVEC_JITTER``), SIGKILLs every 0.05-0.3 s,
Ctrl-Cs and hanging steps, through ``step``, ``rollout``, ``send``/``recv``, ``reset`` and
``get_attr``, every row checked after every round (``tests/round_stress.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [1])
def test_rounds_under_jitter_and_kills_hold_every_row_and_leave_nothing(seed):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "round_stress.py"), "--seconds", "15", "--workers", "2,4",
         "--seed", str(seed), "--trace", "20"],
        capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    runs = [eval(line) for line in out.stdout.splitlines() if line.startswith("{'workers'")]
    assert [r["workers"] for r in runs] == [2, 4]
    for r in runs:  # every kind of round ran, and faults struck
        assert min(r[k] for k in ("step", "rollout", "send", "recv", "reset", "get_attr")) > 0, r
        assert r["restarted"] > 0 and r["rows checked"] > 1000, r
    summary = eval(out.stdout.splitlines()[-1])
    assert summary["kills"] > 50 and summary["sigints"] > 0, summary
