# Everything installs itself: `make test` and `make bench` work on a fresh machine with Python 3.11+.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp-install
BENCH_STAMP := $(VENV)/.stamp-bench

.PHONY: stress test lint conformance bench bench-full bench-quick bench-docs bench-micro bench-multiagent bench-ray bench-snapshots bench-training bench-scaling bench-gpu bench-instructions venv clean test-arm64 test-py313 test-py314 test-pythons test-macos-profile bench-caller-cost bench-start-methods bench-round-phases bench-round-floor

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The benchmarks also measure real envs (Atari, MuJoCo) and EnvPool: optional, each reported as
# not run when it does not install here.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,atari,mujoco]' || echo "the atari/mujoco extras did not install: make bench reports those envs as not run"
	$(PY) -m pip install --quiet envpool || echo "envpool did not install: make bench reports it as not run"
	touch $(BENCH_STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --durations=12

# The core suite under macOS's constraints, simulated here (tests/macos_profile.py): spawn as the
# default start method, no os.sched_getaffinity, no /proc. .ci/run runs it after the full suite.
CORE_SUITE = tests/test_equivalence.py tests/test_faults.py tests/test_async.py tests/test_rollout.py \
	tests/test_gae.py tests/test_snapshots.py tests/test_sync.py tests/test_barrier.py tests/test_layout.py \
	tests/test_segment.py tests/test_handshake.py tests/test_platforms.py
# Left out there: the memory and oom_kill faults under fork, whose test envs play Linux's RLIMIT_AS
# and OOM killer by reading /proc, hidden in a forked worker too (macOS has neither; the spawn and
# forkserver cases run: their workers are new interpreters, outside the profile).
MACOS_LEFT_OUT = $(foreach t,test_every_death_raises_a_clear_error_and_closes test_every_death_restarts_its_worker,\
	$(foreach f,memory oom_kill,--deselect "tests/test_faults.py::$(t)[$(f)-fork]"))
test-macos-profile: $(STAMP)
	SHMVEC_TEST_PROFILE=macos $(PY) -m pytest -q --durations=8 $(CORE_SUITE) $(MACOS_LEFT_OUT)

# The round under faults at length (#51), about 13 minutes: the jitter stress (random sleeps at
# every probe point, SIGKILLs, Ctrl-Cs, hanging steps, every row checked), then the chaos run
# (SIGKILLs alone, every 0.05-0.3 s, through step, rollout and send/recv: every call returns).
# make test runs the jitter stress for 15 s a worker count (tests/test_round_jitter.py). The
# killer's thread makes the default start workers from the forkserver; the chaos run is repeated
# with forked workers (--context fork), the way a single-threaded caller starts them.
STRESS_SECONDS ?= 120
stress: $(STAMP)
	$(PY) tests/round_stress.py --seconds $(STRESS_SECONDS) --workers 2,4 --trace 20
	$(PY) tests/round_stress.py --seconds $(STRESS_SECONDS) --workers 2,4 --no-jitter --sigint-rate 0 \
	    --hang-rate 0 --ops step,rollout,send,recv --trace 20
	$(PY) tests/round_stress.py --seconds $(STRESS_SECONDS) --workers 2,4 --no-jitter --sigint-rate 0 \
	    --hang-rate 0 --ops step,rollout,send,recv --trace 20 --context fork

# ruff (lint and format check) and mypy over the package, as configured in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check shmvec
	$(VENV)/bin/ruff format --check shmvec
	$(VENV)/bin/mypy

# Gymnasium's tests/vector and SB3's test_vec_envs.py against shmvec (downloads their sources;
# Gymnasium's sdist has no tests: GYMNASIUM_SRC=<checkout, git dir or .tar.gz> supplies them).
conformance: $(STAMP)
	$(PY) tests/conformance/run.py

# The main job, within 15 minutes on 2 cores: the throughput report (shmvec's defaults against the
# vector envs users run today), then its training section: the continuous PPO script against
# Gymnasium's vector envs, SB3's PPO against SB3's (make bench-training runs every script).
bench: $(BENCH_STAMP)
	$(PY) -m shmvec bench
	$(PY) benchmarks/training.py --studies $(BENCH_TRAINING) --json results/latest/training.json \
	    --append-to results/latest/results.md

BENCH_TRAINING ?= ppo_continuous,sb3_ppo

# Every engine at every size (about 25 minutes on 2 cores): what docs/benchmarks.md quotes.
bench-full: $(BENCH_STAMP)
	$(PY) -m shmvec bench --full

bench-quick: $(BENCH_STAMP)
	$(PY) -m shmvec bench --quick

bench-docs: $(BENCH_STAMP)
	$(PY) -m shmvec bench --full --write-docs

# The multi-agent workloads alone (MPE simple_spread, pistonball): MultiAgentVecEnv against SuperSuit, the serial loop and the ceiling.
bench-multiagent: $(BENCH_STAMP)
	$(PY) -m shmvec bench --workloads mpe-simple-spread,butterfly-pistonball

# RayVecEnv.rollout against a local ShmVecEnv.rollout (its own local Ray cluster).
bench-ray: $(STAMP)
	$(PY) benchmarks/ray_rollout.py --json results/ray_rollout.json

# get_state/set_state of 16 CartPole, Pong and Ant envs, against a step of them (docs/snapshots.md).
bench-snapshots: $(BENCH_STAMP)
	$(PY) benchmarks/snapshots.py --json results/snapshots.json

# The training scripts of examples/training/ (CleanRL-style PPO: discrete, continuous, Atari; SB3's
# PPO), each at its defaults on shmvec and on the vector envs users have today, in paired rounds.
bench-training: $(BENCH_STAMP)
	$(PY) benchmarks/training.py --json results/training.json

# CartPole, Pong and Ant at 16, 64 and 256 envs over 1..cores workers, sync and async, against the
# ceiling (and gym Async where its process per env fits): the tables #28 asks of a 16-core machine.
bench-scaling: $(BENCH_STAMP)
	$(PY) benchmarks/scaling.py --workloads cartpole,atari-pong,mujoco-ant --num-envs 16,64,256 \
	    --engines split-serial,shmvec,shmvec-async,gym-async-shm --max-procs 70 --json results/scaling.json

# TorchVecEnv's pinned asynchronous copies against torch.as_tensor(obs).to(device) (a GPU if torch sees one).
bench-gpu: $(BENCH_STAMP)
	$(PY) benchmarks/gpu.py --json results/gpu.json

# Instructions per env step under valgrind's callgrind (needs valgrind): immune to a noisy machine.
bench-instructions: $(STAMP)
	$(PY) benchmarks/instructions.py --num-envs 8,32,128 --json results/instructions.json

# The core suite under other Pythons, each in a Debian root filesystem that builds itself once under
# .chroots/ (needs root or sudo): aarch64 Python 3.11 through QEMU user-mode emulation, and Debian's
# native Python 3.13 and 3.14 (forkserver by default); see tests/chroot/README.md.
test-arm64:
	bash tests/chroot/run.sh arm64

test-py313:
	bash tests/chroot/run.sh py313

test-py314:
	bash tests/chroot/run.sh py314

test-pythons: test-py313 test-py314

# What each start method costs (build, rebuild, restart after a SIGKILL) under this Python and
# under Python 3.14 (its chroot, as test-py314): docs/architecture.md, "The start method".
bench-start-methods: $(STAMP)
	$(PY) benchmarks/start_methods.py --json benchmarks/results-2core/start_methods-py311.json
	bash tests/chroot/run.sh py314 --python benchmarks/start_methods.py --json /results/start_methods-py314.json

# The calling process's CPU, instructions and wall time per synchronous round, 1..64 workers
# (do-nothing envs; needs valgrind for the instructions): docs/benchmarks.md, "Many cores".
bench-caller-cost: $(STAMP)
	$(PY) benchmarks/caller_cost.py --json benchmarks/results-2core/caller_cost.json --write-docs

# Where the caller's instructions go in one round, function by function (needs valgrind and a C
# compiler): docs/benchmarks.md, "Where a round's instructions go".
bench-round-phases: $(STAMP)
	$(PY) benchmarks/round_phases.py --json benchmarks/results-2core/round_phases.json --write-docs

bench-round-floor: $(STAMP)
	$(PY) benchmarks/round_floor.py --json benchmarks/results-2core/round_floor.json --write-docs

bench-micro: $(STAMP)
	$(PY) -m pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) results .pytest_cache
