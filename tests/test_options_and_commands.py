"""Options and commands are declared once: the constructor, the adapters, the pool, the worker and
the stepper all read the same declarations (shmvec.options.Options, shmvec.protocol.Command)."""

import inspect
from functools import partial

import gymnasium as gym
import pytest

import shmvec
from shmvec import protocol as P
from shmvec.options import Options, passed_on
from shmvec.stepper import Stepper


def cartpole():
    return gym.make("CartPole-v1")


def test_constructor_keywords_are_the_options_fields_with_their_defaults():
    params = inspect.signature(shmvec.ShmVecEnv.__init__).parameters
    keywords = {name: p.default for name, p in params.items() if p.kind is p.KEYWORD_ONLY}
    fields = {name: getattr(Options, name) for name in Options.names()}
    assert list(keywords) == list(fields)
    assert keywords == fields


def test_every_option_is_documented_in_the_class_docstring():
    doc = shmvec.ShmVecEnv.__doc__
    missing = [name for name in Options.names() if f"\n    {name} :" not in doc]
    assert not missing


def test_options_are_resolved_and_frozen():
    options = Options.resolve(8, {"num_workers": 2, "batch_size": 4, "torch_threads": "auto"})
    assert options.num_workers == 2 and options.batch_size == 4 and options.num_blocks == 2
    assert options.autoreset_mode is gym.vector.AutoresetMode.NEXT_STEP
    assert isinstance(options.torch_threads, int) and options.torch_threads >= 1
    worker = options.for_worker(spin="a policy")
    assert worker == P.WorkerOptions(autoreset_mode="NextStep", worker_threads=1, spin="a policy")
    with pytest.raises(AttributeError):
        options.num_workers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "given, error, words",
    [
        ({"on_error": "ignore"}, ValueError, "on_error"),
        ({"worker_threads": 0}, ValueError, "worker_threads"),
        ({"torch_threads": -1}, ValueError, "torch_threads"),
        ({"batch_size": 3, "num_workers": 2}, ValueError, "multiple of the envs per block"),
        ({"autoreset_mode": "sometimes"}, ValueError, "autoreset_mode"),
        ({"num_worker": 2}, TypeError, "unknown ShmVecEnv option"),
    ],
)
def test_bad_options_are_refused_by_name(given, error, words):
    with pytest.raises(error, match=words):
        Options.resolve(8, given)


def test_more_workers_than_a_broadcast_can_count_are_refused():
    """A broadcast round counts its workers in 16 bits of main's DONE word (protocol.count_base)."""
    assert Options.resolve(70_000, {"num_workers": 65_535}).num_workers == 65_535
    with pytest.raises(ValueError, match="num_workers must be at most 65535"):
        Options.resolve(70_000, {"num_workers": 65_536})


def test_adapters_take_every_option_but_those_they_set():
    passed_on("SubprocVecEnv", {"check_finite": True, "torch_threads": None}, {"copy": "owned arrays"})
    with pytest.raises(TypeError, match="sets 'copy' itself"):
        passed_on("SubprocVecEnv", {"copy": False}, {"copy": "owned arrays"})
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['spin'\].*'spin_us'") as info:
        passed_on("SubprocVecEnv", {"spin": 1.0}, {"copy": "owned arrays"})
    assert "'copy'" not in str(info.value).split("takes:")[1]


def test_make_sorts_keywords_by_the_options():
    envs = shmvec.make("CartPole-v1", num_envs=2, num_workers=1, max_episode_steps=7, check_finite=True)
    try:
        assert envs.num_workers == 1 and envs.check_finite
        assert envs.get_attr("spec")[0].max_episode_steps == 7
    finally:
        envs.close()


def test_every_command_has_a_stepper_method_and_a_restart_rule():
    for cmd in P.Command:
        assert callable(getattr(Stepper, cmd.handler)), cmd
        assert isinstance(cmd.restart, P.Restart)
        assert P.row(int(cmd)) is cmd and P.phase(int(cmd)) == cmd.phase
    assert P.row(99) is None and P.phase(99) == "99" and P.restart(99) is P.Restart.RAISE
    # A segment's descriptor follows exactly the attach commands, which a restarted block gets again.
    assert {c for c in P.Command if c.descriptor} == {c for c in P.Command if c.restart is P.Restart.RESEND}
    assert {c for c in P.Command if c.reports} == {P.Command.STEP, P.Command.RESET, P.Command.ROLLOUT_STEP}
    assert P.WITH_DESCRIPTOR == {int(c) for c in P.Command if c.descriptor}


def test_a_restarted_worker_gets_the_attached_segments_again():
    """Restart.RESEND: after a restart, the new worker steps into the rollout storage and writes the
    info columns, as the block it replaced did."""
    from tests.envs_for_tests import FaultyEnv

    fns = [partial(FaultyEnv, "raise", 40)] + [FaultyEnv] * 3
    envs = shmvec.ShmVecEnv(fns, num_workers=2, on_error="restart")
    try:
        envs.reset(seed=0)
        pool = envs._session.pool
        first = envs.rollout(lambda obs: [0] * 4, num_steps=60)
        assert len(envs.restarts) == 1 and envs.restarts[0][0] == 0
        assert set(pool.attached) >= {P.Command.ROLLOUT_ATTACH}
        batch = envs.rollout(lambda obs: [0] * 4, num_steps=60)
        assert batch["rewards"][:, 0].any(), "the new worker of block 0 writes its rows"
        assert first is not None
    finally:
        envs.close()


def test_on_error_and_check_finite_can_change_while_it_runs():
    envs = shmvec.ShmVecEnv([cartpole] * 2, num_workers=1)
    try:
        envs.check_finite, envs.on_error = True, "restart"
        assert envs.check_finite and envs.on_error == "restart" and envs._session.check_finite
        with pytest.raises(ValueError, match="on_error"):
            envs.on_error = "ignore"
        with pytest.raises(AttributeError, match="fixed"):
            envs._session.set_option("num_workers", 2)
    finally:
        envs.close()


def test_a_worker_unpickles_its_options_before_numpy_or_gymnasium_loads():
    """A spawned worker gets its WorkerOptions as it starts, before it caps its thread pools: the
    record must hold plain values only.
    """
    import pickle
    import subprocess
    import sys

    from shmvec.sync import spin_policies

    spin, _ = spin_policies(2, 2, 2)
    blob = pickle.dumps(Options.resolve(4, {"num_workers": 2, "worker_threads": 3}).for_worker(spin))
    code = (
        "import pickle, sys; o = pickle.loads(sys.stdin.buffer.read()); "
        "print(o.worker_threads, o.autoreset_mode, 'numpy' in sys.modules, 'gymnasium' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True).stdout
    assert out.decode().split() == ["3", "NextStep", "False", "False"]
