"""The benchmark harness: measuring, skipping, failing, reporting, writing files, tuning, the CLI.

Timings are never asserted: measurements here use windows of a few milliseconds.
"""

from __future__ import annotations

import functools
import io
import json
import multiprocessing as mp
import pickle
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from shmvec.bench import cli
from shmvec.bench.classic import ClassicSubprocVecEnv
from shmvec.bench.engines import ENGINES, Engine, RunSpec, get_engines
from shmvec.bench.machine import machine_info, machine_line, parallel_scaling
from shmvec.bench.measure import RunResult, Timing, measure, measure_group, spread, step_for
from shmvec.bench.memory import tree_memory
from shmvec.bench.output import BEGIN, END, update_docs, write_results
from shmvec.bench.progress import Progress, format_duration
from shmvec.bench.report import (
    format_rate,
    format_ratio,
    full_table,
    load_json,
    render_markdown,
    scaling_text,
    summary_table,
    targets_table,
    write_json,
)
from shmvec.bench.serial import SerialLoop
from shmvec.bench.sweep import SweepConfig, SweepResult, plan_sweep, run_sweep
from shmvec.bench.targets import Target, evaluate
from shmvec.bench.tuning import Candidate, TuneResult, tune, worker_choices
from shmvec.bench.workloads import WORKLOADS, GymMake, Workload
from shmvec.envs import SyntheticEnv

TINY = Timing(seconds=0.01, repeats=2, warmup=0.0)
small_env = functools.partial(SyntheticEnv, obs_shape=(3,), episode_steps=3)
SMALL = Workload("small", "small env", "3 floats, free step", small_env)


def spec(n: int = 3, workers: int = 2) -> RunSpec:
    return RunSpec(SMALL, n, workers, seed=0)


def action_space():
    return small_env().action_space


# -- engines ------------------------------------------------------------------------------------
def test_classic_subproc_steps_autoresets_and_closes():
    envs = ClassicSubprocVecEnv([small_env] * 3)
    obs = envs.reset(seed=5)
    assert obs.shape == (3, 3)
    ref = SerialLoop([small_env] * 3).reset(seed=5)
    np.testing.assert_array_equal(obs, np.stack(ref))  # env i seeded with seed + i
    ended = False
    for _ in range(8):
        obs, rewards, dones, infos = envs.step(np.array([0, 1, 2]))
        assert obs.shape == (3, 3) and rewards.shape == (3,) and dones.dtype == bool
        for done, info in zip(dones, infos):
            if done:
                ended = True
                assert info["terminal_observation"].shape == (3,)
    assert ended  # episodes last 1..4 steps: some ended and were reset in the worker
    procs = list(envs.procs)
    envs.close()
    envs.close()  # twice is fine
    assert not any(p.is_alive() for p in procs)
    assert not [p for p in mp.active_children() if p.name.startswith("classic-subproc")]


def test_serial_loop_resets_ended_episodes():
    loop = SerialLoop([small_env] * 2)
    loop.reset(seed=0)
    for _ in range(10):
        loop.step([0, 1])
    assert all(env._t <= 4 for env in loop.envs)  # episodes last 1..4 steps: each ended one was reset
    loop.close()


def test_engine_registry():
    assert list(ENGINES)[0] == "shmvec" and ENGINES["serial"].reference
    assert ENGINES["envpool"].unsupported(WORKLOADS["atari-like"]) == "EnvPool has no such env"
    assert ENGINES["envpool"].unsupported(WORKLOADS["cartpole"]) is None
    assert ENGINES["gym-async-shm"].processes(spec(64)) == 64
    assert ENGINES["shmvec"].processes(spec(64, workers=2)) == 2  # the default: every env in a worker
    assert ENGINES["shmvec-main"].processes(spec(64, workers=2)) == 1
    assert ENGINES["shmvec-main"].processes(spec(1, workers=4)) == 0
    with pytest.raises(ValueError, match="unknown engine"):
        get_engines(["nope"])


def test_missing_peer_is_skipped_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # `import stable_baselines3` now fails
    reason = ENGINES["sb3"].unavailable()
    assert reason.startswith("not installed") and "stable-baselines3" in reason
    config = SweepConfig(workloads=["cartpole"], engines=["sb3", "serial"], num_envs=[2], timing=TINY,
                         probe_scaling=False)
    sweep = run_sweep(config, progress=False)
    sb3 = sweep.get("cartpole", 2, "sb3")
    assert sb3.status == "skipped" and sb3.reason == reason
    assert sweep.get("cartpole", 2, "serial").ok
    md = render_markdown(sweep)
    assert "## Engines not run" in md and "- SB3 Subproc: not installed" in md


# -- measuring ----------------------------------------------------------------------------------
def test_measure_serial_and_shmvec():
    for key in ("serial", "shmvec"):
        r = measure(ENGINES[key], spec(4), TINY, action_space())
        assert r.ok, r.reason
        assert len(r.repeats) == 2 and r.steps_per_s == pytest.approx(float(np.median(r.repeats)))
        assert r.vector_steps >= 4 and r.setup_s > 0
        if sys.platform == "linux":
            assert r.rss_mb > 0 and r.pss_mb > 0 and r.base_pss_mb > 0 and r.added_mb() is not None
    assert measure(ENGINES["shmvec"], spec(4, workers=2), TINY, action_space()).workers == 2


class Recorder:
    def __init__(self, fail_step: bool = False, hang: bool = False) -> None:
        self.workers, self.closed, self.fail_step, self.hang = 1, False, fail_step, hang

    def reset(self, seed):
        pass

    def step(self, actions):
        if self.fail_step:
            raise ZeroDivisionError("step exploded\nsecond line")
        if self.hang:
            time.sleep(5)

    def close(self):
        self.closed = True


def fake_engine(build) -> Engine:
    return Engine("fake", "fake", "", build, lambda s: 0)


def test_failing_engine_is_reported_with_its_message():
    def build(spec):
        raise RuntimeError("cannot build")

    r = measure(fake_engine(build), spec(), TINY, action_space())
    assert r.status == "failed" and r.reason == "RuntimeError: cannot build"

    driver = Recorder(fail_step=True)
    r = measure(fake_engine(lambda s: driver), spec(), TINY, action_space())
    assert r.status == "failed" and r.reason == "ZeroDivisionError: step exploded"
    assert driver.closed  # closed even though it failed


def test_hung_engine_times_out():
    driver = Recorder(hang=True)
    t0 = time.perf_counter()
    r = measure(fake_engine(lambda s: driver), spec(), TINY, action_space(), timeout=0.2)
    assert time.perf_counter() - t0 < 3
    assert r.status == "failed" and "gave up" in r.reason and driver.closed


def test_failing_engine_does_not_stop_the_sweep(monkeypatch):
    def build(spec):
        raise OSError("no such thing")

    broken = Engine("broken", "broken", "", build, lambda s: 0)
    monkeypatch.setitem(ENGINES, "broken", broken)
    config = SweepConfig(workloads=["cartpole"], engines=["broken", "serial"], num_envs=[2, 3], timing=TINY,
                         probe_scaling=False)
    sweep = run_sweep(config, progress=False)
    assert [r.status for r in sweep.results] == ["failed", "ok", "failed", "ok"]
    assert "failed: OSError: no such thing" in full_table(sweep)


class Logged(Recorder):
    """A driver that logs its name at every step call into a shared list."""

    def __init__(self, name: str, log: list, fail_at_call: int | None = None) -> None:
        super().__init__()
        self.name, self.log, self.calls, self.fail_at_call = name, log, 0, fail_at_call

    def step(self, actions):
        self.calls += 1
        if self.fail_at_call is not None and self.calls >= self.fail_at_call:
            raise RuntimeError(f"{self.name} broke")
        self.log.append(self.name)


def named_engine(key: str, build) -> Engine:
    return Engine(key, key, "", build, lambda s: 0)


def test_measure_group_takes_windows_in_turn_rotating_the_order():
    log: list[str] = []
    drivers = {k: Logged(k, log) for k in "abc"}
    timing = Timing(seconds=0.005, repeats=3, warmup=0.0)
    engines = [named_engine(k, lambda s, k=k: drivers[k]) for k in "abc"]
    results = measure_group(engines, spec(), timing, action_space(), group=7)
    assert [r.status for r in results] == ["ok"] * 3
    assert all(len(r.repeats) == 3 and r.group == 7 for r in results)
    assert all(s.closed for s in drivers.values())
    # a warm-up call each as it is built, a second warm-up in turn, then three rounds: abc, bca, cab
    runs = [k for i, k in enumerate(log) if i == 0 or log[i - 1] != k]
    assert runs == list("abc") + list("abc") + list("abc") + list("bca") + list("cab")
    assert results[0].paired_with(results[1]) and not results[0].paired_with(RunResult("w", 3, "x", "ok"))


def test_measure_group_fails_members_alone():
    log: list[str] = []
    good, late = Logged("good", log), Logged("late", log, fail_at_call=4)

    def cannot(spec):
        raise OSError("no such engine")

    engines = [named_engine("good", lambda s: good), named_engine("cannot", cannot), named_engine("late", lambda s: late)]
    results = measure_group(engines, spec(), Timing(seconds=0.005, repeats=3, warmup=0.0), action_space(), group=1)
    assert [r.status for r in results] == ["ok", "failed", "failed"]
    assert results[1].reason == "OSError: no such engine" and results[2].reason == "RuntimeError: late broke"
    assert len(results[0].repeats) == 3 and good.closed and late.closed


def test_paired_ratio_is_the_median_of_per_round_ratios():
    def run(engine, repeats, group):
        return RunResult("w", 8, engine, "ok", steps_per_s=float(np.median(repeats)), repeats=repeats, group=group)

    a, b = [100.0, 60.0, 90.0], [50.0, 20.0, 60.0]  # rounds: 2x, 3x, 1.5x; medians: 90 / 50
    paired = SweepResult({}, {}, [run("x", a, 3), run("y", b, 3)], "", 0.0)
    apart = SweepResult({}, {}, [run("x", a, None), run("y", b, None)], "", 0.0)
    assert paired.ratio("w", 8, "x", "y") == pytest.approx(2.0)
    assert apart.ratio("w", 8, "x", "y") == pytest.approx(1.8)
    assert paired.ratio("w", 8, "x", "missing") is None
    target = Target("t", "w", 8, "y", 1.9, engine="x")
    assert evaluate(paired, [target])[0].status == "met" and evaluate(apart, [target])[0].status == "missed"
    assert paired.round_ratios("w", 8, "x", "y") == pytest.approx([2.0, 3.0, 1.5]) and apart.round_ratios(
        "w", 8, "x", "y") == []
    # the report gives the spread of the rounds beside their median
    assert evaluate(paired, [target])[0].detail == "2.00x (median of 3 rounds, rounds 1.50-3.00)"
    assert evaluate(apart, [target])[0].detail == "1.80x"


def test_real_envs_run_at_their_own_size_and_only_when_named_in_a_quick_sweep():
    given = plan_sweep(SweepConfig(workloads=["atari-pong"], engines=["serial"], num_envs=[64], sizes_as_given=True))
    assert [(p.workload.key, p.num_envs) for p in given] == [("atari-pong", 64)]  # a scaling study's size
    plan = plan_sweep(SweepConfig(workloads=["atari-pong", "cartpole"], engines=["serial"], num_envs=[8, 32]))
    assert sorted({(p.workload.key, p.num_envs) for p in plan}) == [("atari-pong", 16), ("cartpole", 8),
                                                                    ("cartpole", 32)]
    quick = {p.workload.key for p in plan_sweep(SweepConfig.quick_preset(engines=["serial"]))}
    assert "cartpole" in quick and not quick & {"atari-pong", "mujoco-ant", "mujoco-halfcheetah"}
    full = {p.workload.key for p in plan_sweep(SweepConfig.full(engines=["serial"]))}
    assert {"atari-pong", "mujoco-ant", "mujoco-halfcheetah"} <= full and "atari-breakout" not in full


def test_sweep_measures_light_engines_together_and_peers_alone():
    config = SweepConfig(workloads=["cartpole"], engines=["shmvec", "gym-async-shm", "serial"], num_envs=[3],
                         timing=TINY, num_workers=2, probe_scaling=False)
    sweep = run_sweep(config, progress=False)
    runs = {r.engine: r for r in sweep.results}
    assert [r.engine for r in sweep.results] == ["shmvec", "gym-async-shm", "serial"]  # plan order
    assert all(r.ok for r in sweep.results), [r.reason for r in sweep.results]
    assert runs["shmvec"].group is not None and runs["shmvec"].paired_with(runs["serial"])
    assert runs["gym-async-shm"].group is None  # 3 processes for 2 workers: measured alone
    assert "take their windows in turn" in render_markdown(sweep)


def test_step_for_counts_steps():
    calls = []

    class S:
        def step(self, a):
            calls.append(a)

    steps, elapsed = step_for(S(), [1, 2, 3], 0.0, min_steps=5)
    assert steps == 5 and calls == [1, 2, 3, 1, 2] and elapsed >= 0


def test_tree_memory_counts_children():
    mem = tree_memory()
    if sys.platform != "linux":
        pytest.skip("/proc only")
    assert mem.processes >= 1 and mem.rss_mb > 1
    envs = ClassicSubprocVecEnv([small_env] * 2)
    try:
        assert tree_memory().processes >= mem.processes + 2
    finally:
        envs.close()


# -- planning -----------------------------------------------------------------------------------
def test_caps_skip_sizes_with_too_many_processes():
    config = SweepConfig(workloads=["atari-like"], engines=["shmvec", "gym-async-shm", "serial"],
                         num_envs=[8, 16], max_procs=8, timing=TINY)
    plan = {(p.num_envs, p.engine.key): p for p in plan_sweep(config)}
    assert plan[(8, "gym-async-shm")].skip is None
    assert "capped: would start 16 processes" in plan[(16, "gym-async-shm")].skip
    assert plan[(16, "shmvec")].skip is None and plan[(16, "serial")].skip is None
    assert plan[(16, "gym-async-shm")].estimate_s == 0 < plan[(16, "shmvec")].estimate_s


def test_presets_and_unknown_names():
    quick, full = SweepConfig.quick_preset(), SweepConfig.full()
    assert quick.quick and quick.timing.seconds < full.timing.seconds and max(quick.num_envs) < max(full.num_envs)
    assert 256 in full.num_envs and full.timing.repeats >= 5  # targets are medians of >= 5 per-round ratios
    with pytest.raises(ValueError, match="unknown workload"):
        plan_sweep(SweepConfig(workloads=["nope"]))


def test_make_bench_runs_the_standard_report_and_bench_full_every_engine():
    from shmvec.bench.cli import _config, build_parser
    from shmvec.bench.sweep import STANDARD_ENGINES

    def config(*argv):
        return _config(build_parser().parse_args(["bench", *argv]))

    standard, full = config(), config("--full")
    assert standard.engines == list(STANDARD_ENGINES) and full.engines is None
    assert standard.timing == full.timing  # figures as steady as the full sweep's
    assert set(standard.num_envs) < set(full.num_envs)
    assert {"shmvec", "split-serial", "gym-sync", "gym-async-shm", "sb3"} <= set(standard.engines)
    assert config("--engines", "shmvec,serial").engines == ["shmvec", "serial"]
    plan = [p for p in plan_sweep(standard) if p.skip is None]
    assert len(plan) < len([p for p in plan_sweep(full) if p.skip is None]) * 0.6


# -- reporting ----------------------------------------------------------------------------------
def fabricated() -> SweepResult:
    def ok(w, n, e, rate):
        return RunResult(w, n, e, "ok", steps_per_s=rate, repeats=[rate * 0.9, rate, rate * 1.1],
                         vector_steps=10, workers=2 if e == "shmvec" else 1, rss_mb=100.0, pss_mb=50.0)

    results = [
        ok("atari-like", 128, "shmvec", 300_000.0),
        ok("atari-like", 128, "gym-sync", 100_000.0),
        ok("atari-like", 128, "gym-async-shm", 30_000.0),
        ok("atari-like", 128, "serial", 600_000.0),
        RunResult("atari-like", 128, "sb3", "skipped", "not installed: no"),
        ok("cost-100us", 32, "shmvec", 15_000.0),
        RunResult("cost-100us", 32, "gym-sync", "failed", "RuntimeError: x"),
        ok("cost-100us", 32, "serial", 10_000.0),
        RunResult("cost-100us", 32, "sb3", "skipped", "not installed: no"),
        ok("heavy-tail", 8, "shmvec", 5000.0),
        ok("heavy-tail", 8, "gym-sync", 2000.0),
        ok("heavy-tail", 8, "serial", 4000.0),
        ok("heavy-tail", 32, "shmvec", 6000.0),
        ok("heavy-tail", 32, "gym-sync", 7000.0),
        RunResult("heavy-tail", 32, "serial", "skipped", "capped: would start 32 processes (max_procs=8)"),
        RunResult("heavy-tail", 8, "sb3", "skipped", "not installed: no"),
        RunResult("heavy-tail", 32, "sb3", "skipped", "not installed: no"),
    ]
    config = SweepConfig(timing=Timing(1.5, 3, 0.2), num_workers=2).to_dict()
    return SweepResult(machine=machine_info(), config=config, results=results, started="2024-01-02T03:04:05+00:00",
                       elapsed_s=12.0, workload_labels={"atari-like": "Atari-like 84x84x4"},
                       engine_labels={e.key: e.label for e in ENGINES.values()})


def test_targets_met_missed_and_not_measured():
    outcomes = {o.target.peer: o for o in evaluate(fabricated())[:3]}
    assert outcomes["gym-sync"].status == "met" and outcomes["gym-sync"].ratio == pytest.approx(3.0)
    assert outcomes["gym-async-shm"].status == "missed" and outcomes["gym-async-shm"].ratio == pytest.approx(10.0)
    assert outcomes["serial"].status == "missed" and outcomes["serial"].ratio == pytest.approx(1.5)
    heavy = evaluate(fabricated())[3]
    # worst pair: 6000 / 7000 against gym Sync at 32 envs
    assert heavy.status == "missed" and heavy.ratio == pytest.approx(6 / 7) and "gym Sync at 32 envs" in heavy.detail
    absent = evaluate(fabricated(), [Target("t", "cartpole", 8, "gym-sync", 1.0)])[0]
    assert absent.status == "not measured" and absent.ratio is None
    failed = evaluate(fabricated(), [Target("t", "cost-100us", 32, "gym-sync", 1.0)])[0]
    assert failed.status == "not measured" and "RuntimeError: x" in failed.detail
    strict = Target("t", "heavy-tail", 8, "serial", 1.25, strict=True)
    assert evaluate(fabricated(), [strict])[0].status == "missed"  # exactly 1.25: not strictly ahead


def test_markdown_tables():
    sweep = fabricated()
    md = render_markdown(sweep, plots=["results/x/atari-like.png"])
    assert md.startswith("# shmvec throughput report")
    assert "| Atari-like 84x84x4 | 128 | shmvec (2 workers) | 300,000 | ±10% | 0.50x | 1.00x | 50 |  |" in md
    assert "| Atari-like 84x84x4 | 128 | gym Async (shm) | 30,000 | ±10% | 0.05x | 10.0x | 50 |  |" in md
    assert "| 100 us env at 32 envs: >= 1.8x the serial loop | 1.50x | **missed** |" in md
    assert "capped: would start 32 processes" in md and "failed: RuntimeError: x" in md
    assert "SB3" not in summary_table(sweep) and "- SB3 Subproc: not installed: no" in md
    assert "![atari-like](results/x/atari-like.png)" in md
    header = summary_table(sweep).splitlines()[0]
    assert header == "| workload | num_envs | shmvec steps/s | vs gym Sync | vs gym Async (shm) | vs serial loop |"
    assert "| Atari-like 84x84x4 | 128 | 300,000 | 3.00x | 10.0x | 0.50x |" in summary_table(sweep)
    assert "| cost-100us | 32 | 15,000 | failed | - | 1.50x |" in summary_table(sweep)
    assert render_markdown(sweep, heading_level=3).startswith("### shmvec throughput report")


def test_memory_column_shows_what_the_engine_added():
    sweep = fabricated()
    assert "mem MB (PSS)" in full_table(sweep)  # results without a baseline: absolute totals
    for r in sweep.results:
        r.base_rss_mb, r.base_pss_mb = 90.0, 45.0
    table = full_table(sweep)
    assert "mem MB added (PSS)" in table
    assert "| Atari-like 84x84x4 | 128 | gym Sync | 100,000 | ±10% | 0.17x | 3.00x | 5 |  |" in table


def test_formatting_helpers():
    assert format_rate(1234567.8) == "1,234,568" and format_rate(None) == "-"
    assert format_ratio(3.14159) == "3.14x" and format_ratio(31.4) == "31.4x" and format_ratio(None) == "-"
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.1) and spread([1.0]) is None
    assert format_duration(75) == "1:15" and format_duration(4000) == "1:06:40"


def test_json_round_trip(tmp_path):
    sweep = fabricated()
    path = write_json(sweep, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["machine"]["cpu"] and len(data["results"]) == len(sweep.results)
    again = load_json(path)
    assert again.results == sweep.results and again.config == sweep.config
    assert render_markdown(again) == render_markdown(sweep)


def test_parallel_capacity_is_reported():
    result = parallel_scaling(2, seconds=0.02)
    assert result["processes"] == 2 and result["speedup"] > 0
    assert parallel_scaling(1) == {"processes": 1, "speedup": 1.0}
    sweep = fabricated()
    assert scaling_text(sweep) is None
    sweep.machine["parallel_scaling"] = {"processes": 2, "samples": [1.95, 1.9, 1.98]}
    text = scaling_text(sweep)
    assert "ran 1.95x as fast as in one process (median of 3 probes during the sweep, lowest 1.90x" in text
    assert "Warning" not in text and "fell well short" not in text
    assert "(machine ceiling 1.95x)" in targets_table(sweep)
    sweep.machine["parallel_scaling"] = {"processes": 2, "samples": [1.2, 1.9, 1.95]}
    assert "fell well short" in scaling_text(sweep) and "Warning" not in scaling_text(sweep)
    sweep.machine["parallel_scaling"] = {"processes": 2, "samples": [1.2, 1.1, 1.95]}
    assert scaling_text(sweep).startswith("**Warning") and scaling_text(sweep) in render_markdown(sweep)


def test_sweep_probes_before_each_workload_and_at_the_end(monkeypatch):
    calls = []
    monkeypatch.setattr("shmvec.bench.sweep.parallel_scaling", lambda k: calls.append(k) or {"speedup": 1.5})
    config = SweepConfig(workloads=["cartpole", "atari-like"], engines=["serial"], num_envs=[2], timing=TINY,
                         num_workers=2)
    sweep = run_sweep(config, progress=False)
    assert calls == [2, 2, 2] and sweep.machine["parallel_scaling"] == {"processes": 2, "samples": [1.5] * 3}


def test_machine_description():
    info = machine_info()
    assert info["usable_cores"] >= 1 and info["python"] and info["versions"]["numpy"]
    line = machine_line(info)
    assert "Python" in line and "numpy" in line and "gymnasium" in line


# -- files ----------------------------------------------------------------------------------------
def test_results_folder_and_latest(tmp_path):
    sweep = fabricated()
    files = write_results(sweep, tmp_path / "results", plots=False)
    assert files.folder.name == "20240102-030405" and files.plot_note.startswith("plots skipped")
    assert load_json(files.json).results == sweep.results
    assert files.markdown.read_text().startswith("# shmvec throughput report")
    second = write_results(sweep, tmp_path / "results", plots=False)
    assert second.folder.name == "20240102-030405-2"
    latest = tmp_path / "results" / "latest"
    assert (latest / "results.json").read_text() == second.json.read_text()


def test_plots_without_matplotlib_are_skipped(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    files = write_results(fabricated(), tmp_path, plots=True)
    assert files.plots == [] and "matplotlib" in files.plot_note


def test_plots_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    files = write_results(fabricated(), tmp_path, plots=True)
    assert sorted(p.name for p in files.plots) == ["atari-like.png", "cost-100us.png", "heavy-tail.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in files.plots)
    assert "![atari-like](atari-like.png)" in files.markdown.read_text()


def test_update_docs_rewrites_only_the_block(tmp_path):
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text(f"# Benchmarks\n\nintro\n\n## Latest results\n\n{BEGIN}\nplaceholder\n{END}\n\n## After\n\nkept\n")
    png = tmp_path / "heavy-tail.png"
    png.write_bytes(b"\x89PNG fake")
    update_docs(fabricated(), docs, plots=[png])
    text = docs.read_text()
    assert "placeholder" not in text and text.startswith("# Benchmarks\n\nintro")
    assert text.endswith("## After\n\nkept\n") and "### shmvec throughput report" in text
    assert "![heavy-tail](img/benchmarks/heavy-tail.png)" in text
    assert (docs.parent / "img" / "benchmarks" / "heavy-tail.png").exists()
    update_docs(fabricated(), docs, plots=[png])
    assert docs.read_text() == text  # idempotent

    bare = tmp_path / "bare.md"
    bare.write_text("# Mine\n")
    update_docs(fabricated(), bare)
    assert bare.read_text().startswith("# Mine\n\n## Latest results\n\n" + BEGIN)
    fresh = tmp_path / "new" / "b.md"
    update_docs(fabricated(), fresh)
    assert BEGIN in fresh.read_text() and END in fresh.read_text()


def test_progress_bar_lines():
    out = io.StringIO()
    bar = Progress([1.0, 1.0, 2.0], stream=out)
    bar.show("first")
    bar.advance()
    bar.show("second")
    bar.advance()
    bar.finish("done")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[....................] 0/3") and lines[0].endswith("first")
    assert "1/3" in lines[1] and "left" in lines[1] and lines[-1] == "done"
    silent = io.StringIO()
    Progress([1.0], stream=silent, enabled=False).show("x")
    assert silent.getvalue() == ""


# -- tune -----------------------------------------------------------------------------------------
def test_worker_choices():
    assert worker_choices(2) == [1, 2, 4]
    assert worker_choices(16) == [1, 2, 4, 8, 16, 32]
    assert worker_choices(16, num_envs=8) == [1, 2, 4, 8]
    assert worker_choices(1) == [1, 2]


def test_tune_measures_a_grid_and_prints_code():
    result = tune(small_env, num_envs=2, workers=[1, 2], seconds=0.01, repeats=1, warmup=0.0, progress=False,
                  probe=False)
    cands = [c for c, _ in result.rows]
    assert Candidate(2, 1) in cands and Candidate(2, 2, False, 0) in cands and Candidate(2, 2, True) in cands
    assert Candidate(2, 1, True, 0) not in cands  # no worker process: spin_us changes nothing
    assert all(r.ok for _, r in result.rows) and result.serial[2].ok
    assert result.best in cands and not result.best.step_in_main  # isolation first
    assert result.best_in_main in cands and result.best_in_main.step_in_main
    code = result.code()
    assert code.startswith("import shmvec\n\nenvs = shmvec.ShmVecEnv([make_env] * 2, num_workers=")
    # The printed code builds exactly the configuration that was measured (the engine that
    # measured it was built from the same kwargs()).
    built = {}

    class Capture:
        def __init__(self, env_fns, **kwargs):
            built.update(kwargs, num_envs=len(env_fns))

    exec(code.split("\n", 1)[1], {"shmvec": type("m", (), {"ShmVecEnv": Capture}), "make_env": small_env})
    assert built == {**result.best.kwargs(), "num_envs": 2}
    assert built["step_in_main"] == result.best.step_in_main
    summary = result.summary()
    assert "| num_envs | num_workers |" in summary and "Fastest with every env in a worker:" in summary
    assert "```python" in summary


def test_tune_code_for_ids():
    ok = RunResult("w", 64, "shmvec", "ok", steps_per_s=10.0)
    fast = RunResult("w", 64, "shmvec", "ok", steps_per_s=20.0)
    rows = [(Candidate(64, 2), ok), (Candidate(64, 3, False, 0), fast)]
    res = TuneResult("shmvec/AtariLike-v0", "shmvec.envs:shmvec/AtariLike-v0", True, rows,
                     env_kwargs={"step_us": 5})
    assert res.best == Candidate(64, 3, False, 0)
    res.machine, res.scaling = {"usable_cores": 2}, 1.1
    assert "Warning: Parallel capacity: CPU-bound work in 2 processes ran 1.10x" in res.summary()
    assert res.code() == ('import shmvec\n\nenvs = shmvec.make("shmvec.envs:shmvec/AtariLike-v0", num_envs=64, '
                          "num_workers=3, step_in_main=False, spin_us=0, env_kwargs={'step_us': 5})")
    assert "stepping a block itself" not in res.summary()  # no step_in_main configuration ran


def test_tune_sweeps_sizes_isolated_then_tries_the_options_on_the_best():
    from shmvec.bench.tuning import _grid, _options

    first = _grid(None, [1, 2])
    assert first and all(not c.step_in_main and c.spin_us is None for c in first)
    assert sorted({c.num_envs for c in first}) == [4, 8, 16, 32, 64, 128]
    assert _options(Candidate(32, 2)) == [Candidate(32, 2, True), Candidate(32, 2, True, 0), Candidate(32, 2, False, 0)]
    assert _options(Candidate(16, 1)) == [Candidate(16, 1, True), Candidate(16, 1, False, 0)]


def test_tune_recommends_every_env_in_a_worker_and_names_the_faster_opt_in():
    def run(rate):
        return RunResult("w", 16, "shmvec", "ok", steps_per_s=rate)

    rows = [(Candidate(16, 2), run(100.0)), (Candidate(16, 2, True), run(150.0)), (Candidate(16, 1), run(80.0))]
    res = TuneResult("CartPole-v1", "CartPole-v1", True, rows)
    assert res.best == Candidate(16, 2) and res.best_in_main == Candidate(16, 2, True)
    summary = res.summary()
    assert "Fastest with every env in a worker: 100 steps/s with num_envs=16, num_workers=2, step_in_main=False" in summary
    assert "stepping a block itself: 150 steps/s (50% more)" in summary and "num_workers=1, step_in_main=True" in summary
    assert "takes your process with it" in summary
    assert "num_workers=2, step_in_main=False" in res.code()
    # Slower in main: not mentioned.
    rows[1] = (Candidate(16, 2, True), run(90.0))
    assert "stepping a block itself" not in TuneResult("CartPole-v1", "CartPole-v1", True, rows).summary()


# -- command line -----------------------------------------------------------------------------------
def test_cli_dry_run_and_errors(capsys):
    assert cli.main(["bench", "--quick", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "shmvec bench:" in err and "runs" in err
    assert cli.main(["bench", "--workloads", "nope", "--dry-run"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--num-envs", "0"])
    with pytest.raises(SystemExit):
        cli.main([])
    assert cli.main(["bench", "--list"]) == 0
    assert "heavy-tail" in capsys.readouterr().out
    assert cli.main(["tune", "NoSuchEnv-v9", "--no-progress"]) == 2


def test_cli_end_to_end(tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    argv = ["bench", "--workloads", "cartpole", "--engines", "shmvec,serial", "--num-envs", "2",
            "--seconds", "0.01", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "res"),
            "--no-plots", "--no-progress", "--no-probe", "--write-docs", str(docs)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| CartPole-v1 | 2 | shmvec (2 workers) |" in out and "## Targets" in out
    saved = tmp_path / "res" / "latest" / "results.json"
    assert saved.exists() and "| CartPole-v1 | 2 |" in docs.read_text()
    assert cli.main(["bench", "--from-json", str(saved), "--no-plots"]) == 0
    assert "| CartPole-v1 | 2 | shmvec (2 workers) |" in capsys.readouterr().out


PLAN = ["--dry-run", "--workloads", "cartpole", "--engines", "classic,serial", "--num-envs", "4"]


@pytest.mark.parametrize("module, args", [("shmvec", ["bench", *PLAN]), ("shmvec.bench", PLAN)])
def test_module_entry_points(module, args):
    # (a selection that does not touch the optional peers: importing SB3 means importing torch)
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "2 runs (0 skipped)" in proc.stderr and "cartpole N=4 classic Subproc" in proc.stdout


def test_factories_pickle():
    for w in WORKLOADS.values():
        if w.unavailable():  # a real env whose optional package is not installed: named, not built
            assert w.requires and "not installed" in w.unavailable()
            continue
        fn = pickle.loads(pickle.dumps(w.make_env))
        env = fn()
        env.reset(seed=0)
        env.close()
    assert repr(GymMake("CartPole-v1", max_episode_steps=5)) == "GymMake('CartPole-v1', max_episode_steps=5)"


def test_broken_peer_install_is_skipped_with_the_error(monkeypatch):
    monkeypatch.setattr("importlib.import_module", lambda name: (_ for _ in ()).throw(FileNotFoundError("x" * 300)))
    reason = ENGINES["envpool"].unavailable()
    assert reason.startswith("fails to import: FileNotFoundError: xxx") and len(reason) < 200


def test_sb3_peer_when_installed():
    pytest.importorskip("stable_baselines3")  # optional peer: checked only where it is installed
    r = measure(ENGINES["sb3"], spec(2), TINY, action_space())
    assert r.ok, r.reason
    assert r.workers == 2 and r.processes == 2


def test_torchrl_peer_when_installed():
    pytest.importorskip("torchrl")  # optional peer: checked only where it is installed
    r = measure(ENGINES["torchrl"], spec(3), TINY, action_space())
    assert r.ok, r.reason
    assert r.workers == 3 and r.processes == 3 and r.vector_steps >= 2
    assert ENGINES["torchrl"].unsupported(WORKLOADS["mpe-simple-spread"]) == "a single-agent engine"


def _load_benchmark_script(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / f"{name}.py"
    loaded = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def test_scaling_script_runs_each_worker_count(capsys):
    scaling = _load_benchmark_script("scaling")
    assert scaling.default_workers(16) == [1, 2, 4, 8, 16] and scaling.default_workers(6) == [1, 2, 4, 6]
    sweeps = scaling.main(["--workers", "1,2", "--num-envs", "4,8", "--seconds", "0.01", "--repeats", "2",
                           "--workloads", "cartpole"])
    assert set(sweeps) == {1, 2}
    assert all(r.ok for s in sweeps.values() for r in s.results), [r.reason for s in sweeps.values() for r in s.results]
    for n in (4, 8):
        assert sweeps[2].get("cartpole", n, "shmvec").paired_with(sweeps[2].get("cartpole", n, "serial"))
    out = capsys.readouterr().out
    assert "# shmvec scaling: 4 envs" in out and "# shmvec scaling: 8 envs" in out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 4 and rows[0].count("x |") >= 4 and "| - |" in rows[0]
    # A count that does not divide the sizes runs every engine but async (which needs equal blocks).
    sweeps = scaling.main(["--workers", "3", "--num-envs", "4", "--seconds", "0.01", "--repeats", "1",
                           "--workloads", "cartpole", "--engines", "split-serial,shmvec,shmvec-async"])
    assert sweeps[3].get("cartpole", 4, "shmvec").ok and sweeps[3].get("cartpole", 4, "shmvec-async") is None
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3 |")][0].endswith("| - |")
    with pytest.raises(SystemExit):
        scaling.main(["--workers", "0", "--num-envs", "4"])


def test_split_serial_steps_blocks_in_processes_and_closes():
    from shmvec.bench.engines import CEILING
    from shmvec.bench.serial import SplitSerial

    loop = SplitSerial([small_env] * 5, 2, call_s=0.005)
    assert [len(b) for b in loop.blocks] == [3, 2] and loop.workers == 2
    loop.reset(seed=0)
    assert loop.steps_per_call >= 1  # calibrated to the call time
    loop.step(np.array([0, 1, 2, 0, 1]))
    procs = list(loop.procs)
    assert all(p.is_alive() for p in procs)
    loop.close()
    assert not any(p.is_alive() for p in procs)
    r = measure(ENGINES[CEILING], spec(4), TINY, action_space())
    assert r.ok and r.workers == 2, r.reason
    # A reference, not a competitor: "ahead of every other engine" leaves it out.
    sweep = SweepResult({}, {}, [RunResult("small", 4, "shmvec", "ok", steps_per_s=100.0),
                                 RunResult("small", 4, "serial", "ok", steps_per_s=50.0),
                                 RunResult("small", 4, CEILING, "ok", steps_per_s=150.0)], "", 0.0)
    ahead = evaluate(sweep, [Target("t", "small", None, None, 1.0, strict=True)])[0]
    assert ahead.status == "met" and ahead.ratio == pytest.approx(2.0)


def test_split_serial_reports_a_failing_env():
    from shmvec.bench.serial import SplitSerial

    def broken():
        raise ValueError("no such env")

    with pytest.raises(RuntimeError, match="ValueError: no such env"):
        SplitSerial([broken] * 2, 2)
    assert not [p for p in mp.active_children() if p.name == "shmvec-bench-split"]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="benchmarks/instructions.py needs valgrind")
def test_instruction_counts_per_env_step(tmp_path, capsys):
    instructions = _load_benchmark_script("instructions")
    out = tmp_path / "instr.json"
    figures = instructions.main(["--engines", "serial,shmvec", "--num-envs", "2", "--env-steps", "2000",
                                 "--json", str(out)])
    serial, shmvec_step = figures[("cartpole", "serial", 2)], figures[("cartpole", "shmvec", 2)]
    assert 10_000 < serial < 500_000, figures  # a CartPole step in Python: tens of thousands of instructions
    assert shmvec_step > serial, figures  # the same env steps in the same process, plus the engine's own work
    assert len(json.loads(out.read_text())) == 2
    assert "| cartpole | 2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # starts a worker process even at one worker: its work would not count
        instructions.main(["--engines", "shmvec-async"])
    # (--workers counts the calling process and its workers together: benchmarks/instructions.py's
    # own check that every process reported keeps that path honest; a callgrind run of three
    # processes is too slow for the suite)
    with pytest.raises(SystemExit):  # the split-serial ceiling starts processes: only with --workers
        instructions.main(["--engines", "split-serial"])


def test_cli_help_names_the_presets_own_defaults():
    """The bench command's help states the defaults the presets use (they once drifted apart)."""
    from shmvec.bench.cli import build_parser
    from shmvec.bench.sweep import SweepConfig

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    helps = {a.dest: a.help for a in bench._actions}
    full, quick = SweepConfig.full(), SweepConfig.quick_preset()
    assert f"default {full.timing.seconds:g}; quick {quick.timing.seconds:g}" in helps["seconds"]
    assert f"default {full.timing.repeats}; quick {quick.timing.repeats}" in helps["repeats"]
    assert f"default {full.timing.warmup:g}; quick {quick.timing.warmup:g}" in helps["warmup"]
    sizes = [",".join(map(str, c.num_envs)) for c in (SweepConfig.standard(), full, quick)]
    assert f"default {sizes[0]}; --full {sizes[1]}; quick {sizes[2]}" in helps["num_envs"]
    assert "minute" not in helps["quick"]
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    assert f"{full.timing.repeats} windows of {full.timing.seconds:g} s" in doc


# -- multi-agent workloads ------------------------------------------------------------------------
def test_multi_agent_engines_step_agent_rows_and_single_agent_ones_are_not_run():
    pytest.importorskip("mpe2")
    pytest.importorskip("supersuit")
    workload = WORKLOADS["mpe-simple-spread"]
    assert workload.multi_agent and workload.sizes == (16,)
    probe = workload.make_parallel()
    assert len(probe.possible_agents) == workload.agents  # the declared count is the env's
    probe.close()
    ran = ["shmvec", "shmvec-main", "supersuit-serial", "supersuit-mp", "split-serial", "serial"]
    for key, engine in ENGINES.items():
        reason = engine.unsupported(workload)
        assert (reason is None) == (key in ran), (key, reason)
        if key in ("supersuit-serial", "supersuit-mp"):
            assert engine.unsupported(WORKLOADS["cartpole"]) == "a multi-agent engine"
    two = RunSpec(workload, 2, 2, seed=0)
    assert two.rows == 2 * workload.agents
    joint = workload.make_env()
    results = measure_group([ENGINES[k] for k in ran], two, TINY, joint.action_space)
    for r in results:
        assert r.ok, (r.engine, r.reason)
        assert r.num_envs == 2 and r.steps_per_s > 0
    joint.close()


def test_joint_env_passes_each_live_agent_its_action_and_ends_with_the_episode():
    pytest.importorskip("mpe2")
    from shmvec.bench.workloads import JointEnv
    from tests.ma_envs_for_tests import LeavingAgents

    env = JointEnv(LeavingAgents(max_cycles=9))
    assert env.action_space.shape[0] == len(env.possible_agents)
    env.reset(seed=0)
    seen = []
    for _ in range(20):
        live = list(env.env.agents)
        _, _, done, _, _ = env.step(env.action_space.sample())
        seen.append(len(live))
        if done:
            break
    assert done and not env.env.agents and seen == sorted(seen, reverse=True) and seen[0] > seen[-1]
    env.close()


# -- figures quoted in prose ----------------------------------------------------------------------
def test_figures_compute_ratios_ranges_rates_and_tables():
    from shmvec.bench.figures import FigureError, compute

    sweep = fabricated()
    assert compute("ratio atari-like:128 shmvec/gym-sync", sweep) == "3.00x"
    assert compute("ratio atari-like:128 shmvec/gym-async-shm", sweep) == "10.0x"
    # a range over cells; '*' takes the sizes where the ratio was measured (heavy-tail 32 has no serial)
    assert compute("ratio heavy-tail:8,32 shmvec/gym-sync", sweep) == "0.86-2.50x"
    assert compute("ratio heavy-tail:* shmvec/serial", sweep) == "1.25x"
    assert compute("rate atari-like:128 shmvec", sweep) == "300k" and compute("rate cost-100us:32 shmvec", sweep) == "15.0k"
    header = "\n| workload, envs | mine | ratio |\n|---|---:|---:|\n| stale | row | here |\n\n"
    table = compute("rows atari-like:128 cost-100us:32 | shmvec gym-sync/serial", sweep, header)
    assert table == ("\n| workload, envs | mine | ratio |\n|---|---:|---:|\n"
                     "| Atari-like 84x84x4, 128 | 300k | 0.17x |\n| cost-100us, 32 | 15.0k | - |\n\n")
    engines = compute("engines atari-like:128 shmvec,serial | serial", sweep, "| e | r | x |\n|---|---|---|")
    assert engines.splitlines()[3:5] == ["| shmvec | 300,000 | 0.50x |", "| serial loop | 600,000 | 1.00x |"]
    for bad, current in [("ratio cost-100us:32 shmvec/gym-sync", ""),  # gym-sync failed there
                         ("ratio nothing:* shmvec/serial", ""), ("ratio atari-like:x shmvec/serial", ""),
                         ("speed atari-like:128 shmvec", ""), ("rows atari-like:128 | shmvec", "no header")]:
        with pytest.raises(FigureError):
            compute(bad, sweep, current)


def test_write_docs_recomputes_marked_figures_and_keeps_the_sweep(tmp_path):
    from shmvec.bench.figures import DOCS_SWEEP, rewrite, stale

    sweep = fabricated()
    (tmp_path / "docs").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("shmvec is <!-- figure: ratio atari-like:128 shmvec/gym-sync -->9.99x<!-- /figure --> Sync.\n")
    page = tmp_path / "docs" / "other.md"
    page.write_text("no figures\n")
    assert [(s.found, s.expected) for s in stale(readme.read_text(), sweep)] == [("9.99x", "3.00x")]
    update_docs(sweep, tmp_path / "docs" / "benchmarks.md")
    assert readme.read_text() == "shmvec is <!-- figure: ratio atari-like:128 shmvec/gym-sync -->3.00x<!-- /figure --> Sync.\n"
    assert not stale(readme.read_text(), sweep) and page.read_text() == "no figures\n"
    assert load_json(tmp_path / DOCS_SWEEP).to_dict() == json.loads(json.dumps(sweep.to_dict()))
    assert rewrite(readme.read_text(), sweep) == readme.read_text()


def test_figures_from_other_results_files(tmp_path):
    from shmvec.bench.figures import FigureError, compute

    sweep = fabricated()
    (tmp_path / "one.json").write_text(json.dumps(sweep.to_dict()))
    other = fabricated()
    other.results = [RunResult(r.workload, r.num_envs, r.engine, r.status, r.reason,
                               steps_per_s=None if r.steps_per_s is None else r.steps_per_s * (2 if r.engine == "shmvec" else 1))
                     for r in other.results]
    (tmp_path / "by_workers.json").write_text(json.dumps({"1": sweep.to_dict(), "4": other.to_dict()}))
    assert compute("in one.json ratio atari-like:128 shmvec/gym-sync", None, root=tmp_path) == "3.00x"
    assert compute("in by_workers.json#4 ratio atari-like:128 shmvec/gym-sync", None, root=tmp_path) == "6.00x"
    table = compute("in by_workers.json scaling atari-like:128 cost-100us:32 | shmvec/serial", None,
                    "| w | a | b |\n|---|---|---|", root=tmp_path)
    assert table.splitlines()[3:5] == ["| 1 | 0.50x | 1.50x |", "| 4 | 1.00x | 3.00x |"]
    for bad in ("in nothing.json ratio atari-like:128 shmvec/serial", "in by_workers.json#9 ratio atari-like:128 a/b",
                "in by_workers.json ratio atari-like:128 shmvec/serial"):
        with pytest.raises(FigureError):
            compute(bad, None, "| w |\n|---|", root=tmp_path)


def test_figures_read_any_study_results_file(tmp_path):
    from shmvec.bench.figures import FigureError, compute

    (tmp_path / "study.json").write_text(json.dumps([{"rate": 97082.98, "x/y": {"median": 1.6034, "min": 1.4912,
                                                                                "max": 1.7072}}]))
    assert compute("in study.json value 0.rate rate", None, root=tmp_path) == "97,083"
    assert compute("in study.json value 0.rate compact", None, root=tmp_path) == "97.1k"
    assert compute("in study.json value 0.x/y.median ratio", None, root=tmp_path) == "1.60x"
    assert compute("in study.json value 0.x/y range", None, root=tmp_path) == "1.49-1.71"
    for bad in ("in study.json value 1.rate rate", "in study.json value 0.nope ratio", "in study.json value 0.x/y ratio",
                "in gone.json value 0.rate rate"):
        with pytest.raises(FigureError):
            compute(bad, None, root=tmp_path)
