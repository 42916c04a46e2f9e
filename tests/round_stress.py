"""The round under jitter and chaos: thousands of rounds of every kind, with SIGKILLs, Ctrl-Cs
and timeouts at random moments, every row checked after every round (#51).

    .venv/bin/python tests/round_stress.py --seconds 120 --workers 2,4     # the jitter stress
    .venv/bin/python tests/round_stress.py --seconds 120 --no-jitter --sigint-rate 0 \
        --hang-rate 0 --ops step,rollout,send,recv                        # the chaos run
    make stress                                                           # both

Two vector envs of ``CountingEnv`` (:mod:`counting`) run side by side under
``on_error="restart"``: one synchronous (``step``, ``rollout``, ``reset``, ``get_attr``), one
collecting asynchronously (``send``/``recv`` of partial batches). Each operation is drawn at
random; after each, every row it handed out is checked (:class:`counting.Rows`: its own
index, its count plus one, or a reset; ``restarted`` where a block was replaced). Meanwhile:

- a killer thread SIGKILLs a random worker of either env every 0.05-0.3 s (``--kill``);
- the probe points of the round (:mod:`shmvec.probes`) sleep or yield at random in every
  process (``SHMVEC_JITTER``, unless ``--no-jitter``), and in the calling process send it a
  real SIGINT at a random point now and then (``--sigint-rate``);
- an env now and then hangs in its step (action 2) past the env's ``timeout``.

The killer's thread makes the default start method start every worker from the forkserver
(``shmvec.start_methods``); ``--context fork`` forks them instead.

Every call must return: ``step``, ``rollout`` and ``send``/``recv`` without an error (restarts
take the killed blocks' place), ``reset`` and ``get_attr`` either so or with ``WorkerDied`` when
they met a worker killed while idle (their rows say RAISE: the env then closes, and is built
again). A KeyboardInterrupt is followed by a reset. A wrong row, any other error, or a call
that does not return within ``--hang-s`` fails the run; at the end no worker process and no
segment may be left, and this process's descriptors must be as many as at the start.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="wall time per worker count")
    p.add_argument("--workers", default="2,4", help="worker counts to run, one after the other")
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill", default="0.05,0.3", help="seconds between kills, uniform in this range ('' for none)")
    p.add_argument("--sigint-rate", type=float, default=0.002, help="chance of a SIGINT at each probe point of main")
    p.add_argument("--hang-rate", type=float, default=0.0005, help="chance that an env's step hangs past the timeout")
    p.add_argument("--no-jitter", action="store_true", help="no random sleeps at the probe points")
    p.add_argument("--context", default=None, help="start method (default: shmvec's per-start policy)")
    p.add_argument("--hang-s", type=float, default=60.0, help="a call that takes longer fails the run")
    p.add_argument("--ops", default="step,rollout,send,recv,reset,get_attr",
                   help="the operations drawn (the chaos run: step,rollout,send,recv, each must return)")  # fmt: skip
    p.add_argument("--trace", type=int, default=0, help="print the last this many operations on a failure")
    return p.parse_args(argv)


class ChaosProbe:
    """The jitter probe, which also sends the calling process a SIGINT at random while armed."""

    def __init__(self, jitter, sigint_rate: float, seed: int) -> None:
        self.jitter, self.rate = jitter, sigint_rate
        self.main = os.getpid()
        self.armed = False
        self.rng = random.Random(seed)
        self.sigints = 0

    def __call__(self, point: str) -> None:
        if self.jitter is not None:
            self.jitter(point)
        if self.armed and os.getpid() == self.main and point.startswith(("main:", "sleep:", "ring")):
            if self.rng.random() < self.rate:
                self.armed = False
                self.sigints += 1
                os.kill(self.main, signal.SIGINT)


class Killer(threading.Thread):
    """SIGKILLs a random worker of the envs it is given every ``low``-``high`` seconds."""

    def __init__(self, low: float, high: float, seed: int) -> None:
        super().__init__(daemon=True, name="stress-killer")
        self.low, self.high = low, high
        self.rng = random.Random(seed)
        self.envs: list = []
        self.kills = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.rng.uniform(self.low, self.high)):
            pids = [pid for envs in list(self.envs) if not envs.closed for pid in envs.worker_pids]
            if pids:
                try:
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    self.kills += 1
                except (ProcessLookupError, PermissionError):
                    pass


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except FileNotFoundError:
        return -1


class Stress:
    """One run at one worker count; see the module's docstring."""

    def __init__(self, args: argparse.Namespace, workers: int, probe: ChaosProbe, killer: Killer | None) -> None:
        import numpy as np

        from counting import Rows

        self.np, self.Rows = np, Rows
        self.args, self.workers, self.probe, self.killer = args, workers, probe, killer
        self.rng = random.Random(args.seed * 7919 + workers)
        self.counts = dict.fromkeys(
            ("step", "rollout", "send", "recv", "reset", "get_attr", "interrupted", "rebuilt", "restarted"), 0
        )
        self.sync = self.asy = None
        self.sync_rows = self.asy_rows = None
        self.checked = 0  # rows checked by the Rows replaced so far

    # -- the two vector envs -------------------------------------------------------------------
    def _build(self, asynchronous: bool):
        import shmvec
        from counting import counting_fns

        n = self.args.envs
        return shmvec.ShmVecEnv(
            counting_fns(n, slow_s=0.002, hang_s=30.0, hang_rate=self.args.hang_rate, seed=self.rng.randrange(1 << 30)),
            num_workers=self.workers,
            on_error="restart",
            timeout=2.0,
            batch_size=n // 2 if asynchronous else None,
            context=self.args.context,
        )

    def _reset(self, asynchronous: bool) -> None:
        """Reset the env (building it again if it was closed), until a reset is not interrupted."""
        import shmvec

        while True:
            envs = self.asy if asynchronous else self.sync
            if envs is None or envs.closed:
                envs = self._build(asynchronous)
                if asynchronous:
                    self.asy = envs
                else:
                    self.sync = envs
                if self.killer is not None:
                    self.killer.envs = [e for e in (self.sync, self.asy) if e is not None]
                self.counts["rebuilt"] += 1
            rows = self.Rows(self.args.envs)
            try:
                self.probe.armed = True
                obs, _ = envs.reset(seed=self.rng.randrange(1 << 30))
                self.probe.armed = False
                rows.reset(obs)
            except KeyboardInterrupt:
                self.counts["interrupted"] += 1
                continue
            except shmvec.WorkerDied:  # a worker killed while idle: reset's row says RAISE
                assert envs.closed
                continue
            finally:
                self.probe.armed = False
            self.counts["reset"] += 1
            old = self.asy_rows if asynchronous else self.sync_rows
            self.checked += old.checked if old is not None else 0
            if asynchronous:
                self.asy_rows, self.in_flight = rows, set()
            else:
                self.sync_rows = rows
            return

    def _actions(self, n: int):
        return self.np.array([1 if self.rng.random() < 0.1 else 0 for _ in range(n)], self.np.int64)

    # -- the operations ----------------------------------------------------------------------------
    def op_step(self) -> None:
        out = self.sync.step(self._actions(self.args.envs))
        self._restarted(out[4])
        self.sync_rows.step(*out)
        self.counts["step"] += 1

    def op_rollout(self) -> None:
        T = self.rng.randint(2, 6)
        batch = self.sync.rollout(lambda obs: self._actions(len(obs)), num_steps=T)
        for t in range(T):
            after = batch["obs"][t + 1] if t + 1 < T else batch["next_obs"]
            self._restarted(batch["infos"][t])
            self.sync_rows.step(after, batch["rewards"][t], batch["terminations"][t], batch["truncations"][t],
                                batch["infos"][t])  # fmt: skip
        self.counts["rollout"] += 1

    def op_reset(self) -> None:
        self._reset(asynchronous=self.rng.random() < 0.5)

    def op_get_attr(self) -> None:
        import shmvec

        try:
            counts = self.sync.get_attr("count")
        except shmvec.WorkerDied:  # a worker killed while idle: call's row says RAISE
            assert self.sync.closed
            self._reset(asynchronous=False)
            return
        expected = self.sync_rows.count  # (an env whose episode ended keeps its count until its reset step)
        assert list(counts) == expected.tolist(), f"get_attr('count') {counts}, the rows say {expected.tolist()}"
        self.counts["get_attr"] += 1

    def op_send(self) -> None:
        """Send actions to a batch of idle blocks, if there are enough of them (else receive)."""
        envs = self.asy
        idle = [list(block) for block in envs.blocks if not self.in_flight & set(block)]
        per_batch = envs.batch_size // len(envs.blocks[0])
        if len(idle) < per_batch:
            return self.op_recv()
        ids = sorted(i for block in self.rng.sample(idle, per_batch) for i in block)
        envs.send(self._actions(len(ids)), ids)
        self.in_flight |= set(ids)
        self.counts["send"] += 1

    def op_recv(self) -> None:
        """Receive a batch (whichever blocks are ready first) and check its rows."""
        if not self.in_flight:
            return self.op_send()
        obs, rewards, terms, truncs, infos, ids = self.asy.recv()
        ids = ids.tolist()
        assert set(ids) <= self.in_flight, f"recv handed out envs {ids}, in flight {sorted(self.in_flight)}"
        self.in_flight -= set(ids)
        self._restarted(infos)
        self.asy_rows.step(obs, rewards, terms, truncs, infos, env_ids=ids)
        self.counts["recv"] += 1

    def _restarted(self, infos: dict) -> None:
        if "restarted" in infos:
            self.counts["restarted"] += int(self.np.sum(infos["restarted"]))

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> dict:
        ops = [(self.op_step, 40), (self.op_rollout, 10), (self.op_send, 20), (self.op_recv, 20),
               (self.op_reset, 3), (self.op_get_attr, 5)]  # fmt: skip
        wanted = self.args.ops.split(",")
        funcs, weights = zip(*[(f, w) for f, w in ops if f.__name__[3:] in wanted])
        self._reset(False)
        self._reset(True)
        end = time.monotonic() + self.args.seconds
        self.trace: list[str] = []
        while time.monotonic() < end:
            op = self.rng.choices(funcs, weights)[0]
            if self.args.trace:
                self.trace = self.trace[-self.args.trace :] + [op.__name__]
            faulthandler.dump_traceback_later(self.args.hang_s, exit=True)  # a call that hangs ends the run
            try:
                self.probe.armed = True
                op()
            except KeyboardInterrupt:
                self.probe.armed = False
                self.counts["interrupted"] += 1
                self.trace.append("interrupted")
                self._reset(asynchronous=op in (self.op_send, self.op_recv))
            except BaseException:
                print("the last operations:", self.trace, file=sys.stderr)
                raise
            finally:
                self.probe.armed = False
                faulthandler.cancel_dump_traceback_later()
        for envs in (self.sync, self.asy):
            if envs is not None:
                envs.close()
        return {"workers": self.workers, **self.counts,
                "rows checked": self.checked + self.sync_rows.checked + self.asy_rows.checked}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.no_jitter:
        os.environ.setdefault("SHMVEC_JITTER", f"{args.seed},200,0.2")  # read as shmvec.probes loads
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import multiprocessing as mp

    from shmvec import probes, start_methods

    jitter = probes.probe  # the environment's jitter, or None
    probe = ChaosProbe(jitter, args.sigint_rate, args.seed)
    probes.install(probe)
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # (its pipe, once per process: not one of the envs')
    if args.context is None and start_methods.requested(None) == start_methods.AUTO:
        # With the killer's thread running, the workers come from the forkserver (the default's
        # choice): its pipe too stays for the process's life.
        from multiprocessing import forkserver

        start_methods.context("forkserver")
        forkserver.ensure_running()
    fds = open_fds()
    killer = None
    if args.kill:
        low, high = (float(x) for x in args.kill.split(","))
        killer = Killer(low, high, args.seed)
        killer.start()
    results = []
    try:
        for workers in (int(w) for w in args.workers.split(",")):
            stress = Stress(args, workers, probe, killer)
            results.append(stress.run())
            print(results[-1], flush=True)
    finally:
        if killer is not None:
            killer.stopped.set()
            killer.join()
    time.sleep(0.2)
    left = [p.name for p in mp.active_children() if p.name.startswith("shmvec-worker")]
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"shmvec_{os.getpid()}_")]
    import gc

    print({"kills": killer.kills if killer else 0, "sigints": probe.sigints, "fds before": fds,
           "fds after": open_fds(), "gc objects": gc.get_count()}, flush=True)  # fmt: skip
    assert not left, f"worker processes left: {left}"
    assert not shm, f"segments left: {shm}"
    assert open_fds() == fds, f"descriptors: {fds} before, {open_fds()} after"
    return 0


if __name__ == "__main__":
    sys.exit(main())
