"""The worker process: build a block's envs, attach to the segment, serve commands until CLOSE.

The envs themselves are stepped by a :class:`~shmvec.stepper.Stepper`; this module is the loop
around it: waiting for a command (spin, then block), reading its payload, writing the status
and the rare pickled reply, and signalling DONE (see :mod:`shmvec.protocol`).

Only the standard library is imported at module level: a spawned worker sets the thread-count
variables of BLAS/OpenMP before numpy is first imported.
"""

from __future__ import annotations

import gc
import os
import signal

from shmvec.protocol import (
    ARG,
    CMD,
    DONE,
    GO,
    PAYLOAD,
    REPLY_LEN,
    SLEEPING,
    STATUS,
    WITH_DESCRIPTOR,
    Attach,
    Command,
    ConstructError,
    Ready,
    Spaces,
    Status,
    WorkerOptions,
    dumps,
    error_report,
    for_block,
    phase,
    rings,
)
from shmvec.stepper import Stepper, build_envs, close_all
from shmvec.worker_threads import cap_libraries, cap_variables

_STEP, _RESET, _CLOSE = int(Command.STEP), int(Command.RESET), int(Command.CLOSE)
_OK, _REPLY, _ERROR = int(Status.OK), int(Status.REPLY), int(Status.ERROR)


def worker_main(
    block: int, start: int, env_fns_blob: bytes, conn, wake_r, done_w, options: WorkerOptions, relay: list
) -> None:
    """Entry point of a worker process: build the envs, attach, serve commands until CLOSE.

    ``conn`` carries the handshake and the rare pickled payloads and replies; ``wake_r`` and
    ``done_w`` are the read end of this worker's wake pipe and the write end of the shared
    done pipe (``Connection`` objects, so that every start method can pass them); ``relay``,
    ``(block, write end of its wake pipe)`` of each worker this one wakes in a broadcast round.
    ``options``: everything this worker applies, one record (plain values: it is unpickled
    before the thread pools are capped): ``worker_threads`` now, before the envs are built
    (:mod:`shmvec.worker_threads`), the rest in the block's :class:`~shmvec.stepper.Stepper`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process owns shutdown
    # Under fork, everything the parent held is inherited, including objects whose destructors
    # talk to threads that did not survive the fork (a Ray or gRPC client waits forever for
    # them). Freezing keeps the garbage collector away from every inherited object.
    gc.freeze()
    cap_variables(options.worker_threads)

    import multiprocessing as mp

    from shmvec.layout import control_lines

    stepper = None
    try:
        attached = _set_up(block, start, env_fns_blob, conn, options)
        if attached is None:
            return
        stepper, views, layout = attached
        count = _main_counter(views["ctrl"])  # (compiled before Ready, if not inherited)
        conn.send(Ready())
        parent = mp.parent_process()
        _serve(
            stepper,
            control_lines(views),
            memoryview(views["replies"][block]),
            memoryview(views["busy"][block]),
            block,
            conn,
            wake_r.fileno(),
            done_w.fileno(),
            [(child, w.fileno()) for child, w in relay],
            count,
            options.spin,
            parent.sentinel if parent is not None else None,
            bool(layout.pickled("obs/")),
        )
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the main process went away: nothing to report to
    finally:
        if stepper is not None:
            del stepper
        conn.close()


def _set_up(block: int, start: int, env_fns_blob: bytes, conn, options: WorkerOptions) -> tuple | None:
    """Build the envs, report their spaces, attach to the segments: the worker's side of the
    handshake, the same at start-up and on a restart. Returns the block's stepper, the main
    segment's views and layout, or ``None`` when there is nothing to serve (main was told why,
    or went away).

    Whatever fails here (a factory that cannot be rebuilt, an env's constructor, spaces that
    cannot be pickled, mapping the segment) reaches main as a :class:`ConstructError` naming
    the phase, with this process's traceback: never only as an exit code.
    """
    import cloudpickle

    stage, envs = "construct", []
    env_index: int | None = start
    try:
        from shmvec.registrations import quiet_overrides, register_missing

        specs, env_fns = cloudpickle.loads(env_fns_blob)
        register_missing(specs)  # the envs registered in the user's main module, under spawn
        with quiet_overrides(specs):  # (a package the factories import registers them again)
            built = build_envs(env_fns, start, block)
        if not isinstance(built, list):
            conn.send(built)  # an env's constructor raised, or the block's envs disagree
            return None
        envs = built
        cap_libraries(options.worker_threads)  # the pools of what the envs imported, or the fork brought along
        stage = "handshake"
        conn.send_bytes(Spaces.of(envs[0]).pickled())
        msg = conn.recv()
        if not isinstance(msg, Attach):
            close_all(envs)
            return None
        stage, env_index = "attach", None
        from multiprocessing.reduction import recv_handle

        from shmvec.segment import map_fd

        layout = msg.layout
        views = layout.views(map_fd(recv_handle(conn), layout.size))
        env0 = envs[0]
        stepper = Stepper(
            envs, start, layout, views, options, env0.observation_space, env0.action_space, replies_pickled=True
        )
        for cmd, extra in msg.attached:  # the segments attached since the start, as their commands map them
            stepper.run(cmd, (extra, map_fd(recv_handle(conn), extra.size)))
        return stepper, views, layout
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        close_all(envs)
        raise
    except BaseException as exc:
        close_all(envs)
        conn.send(ConstructError(error_report(exc, block, env_index, stage)))
        return None


def _serve(
    envs: Stepper,
    lines: list,
    replies: memoryview,
    busy: memoryview,
    block: int,
    conn,
    wake_r: int,
    done_w: int,
    relay: list[tuple[int, int]],
    count,
    policy,
    parent_sentinel: int | None,
    pickled_obs: bool,
) -> None:
    """Serve commands until CLOSE, waiting for each with ``policy`` (a ``sync.SpinPolicy``).

    ``pickled_obs``: the observation space has pickled leaves, which every STEP and RESET
    reply carries (see ``protocol``). A command comes on this block's line (``GO``), or, for
    every worker at once, on main's line (the broadcast ``GO``): then this worker first wakes
    the workers of ``relay`` (``(block, wake pipe's write end)``, its children in the wake-up
    tree, ``protocol.relay_children``) that sleep; once done, it counts itself on main's line
    (``count``, ``barrier.counter``: the round's tagged count, main's DONE word), and the one
    whose count main named rings it (``protocol.rings``).
    """
    import time

    from shmvec import probes
    from shmvec.barrier import fence
    from shmvec.sync import ring, spin_until

    probe = probes.probe  # (None but in tests: see shmvec.probes)
    mine, main_line = lines[block], lines[-1]
    watch = [parent_sentinel] if parent_sentinel is not None else []
    ppid = os.getppid()
    seq = int(mine[DONE])
    clock = time.perf_counter

    me = for_block(block)  # main's SLEEPING when it waits for this block in particular
    relayed = [(lines[child], fd) for child, fd in relay]

    # A new command is a GO past the last one served, on this line or main's (the broadcast):
    # sequence numbers only grow, and can jump (a restart addresses only the restarted blocks).
    def arrived() -> bool:  # (main's first: a training loop's rounds are broadcasts)
        return main_line[GO] > seq or mine[GO] > seq

    t1 = clock()  # as the last command was seen
    while True:
        t0 = clock()
        # The last command's time, from seeing GO to its DONE: counted after DONE, off the
        # caller's wait (diagnose() reads it); a float64 view.
        busy[0] += t0 - t1  # type: ignore[call-overload]
        if not spin_until(arrived, policy) and not _sleep_until(arrived, mine, wake_r, watch, ppid):
            return  # the main process died: exit quietly
        t1 = clock()
        policy.update(t1 - t0)
        if probe:
            probe("worker:go")
        fence()  # ordering [GO]: GO seen before the command words and the actions are read
        broadcast = int(main_line[GO])
        broadcast_round = broadcast > seq  # every worker's command (one is pending at most)
        if broadcast_round:
            if relayed:
                _relay(relayed, ring)
            seq, cmd, arg, payload = broadcast, int(main_line[CMD]), int(main_line[ARG]), None
        else:
            seq, cmd, arg = int(mine[GO]), int(mine[CMD]), int(mine[ARG])
            payload = conn.recv() if mine[PAYLOAD] else None
        status, reply = _execute(envs, cmd, payload, arg, conn, block, pickled_obs)
        piped = status != _OK and _store_reply(reply, replies, mine)
        mine[STATUS] = status
        if probe:
            probe("worker:ran")
        fence()  # ordering [DONE]: the results, the reply and STATUS (and the actions' reads) before DONE
        mine[DONE] = seq
        if probe:
            probe("worker:done")
        if broadcast_round:  # ordering [COUNT]: the tagged count after this block's DONE, then [SLEEP]'s barrier
            counted = count(seq << 1 | (status != _OK))  # 0: a stale round's, not counted
        else:
            counted = 0
            fence()  # ordering [SLEEP]: DONE before reading main's SLEEPING
        if probe:
            probe("worker:counted")
        if rings(main_line[SLEEPING], me, counted):
            ring(done_w)
        if piped:
            conn.send_bytes(reply)
        if cmd == _CLOSE:
            return


def _sleep_until(arrived, mine, wake_r: int, watch: list[int], ppid: int) -> bool:
    """Block until a command ``arrived()``; False if the main process died first."""
    from shmvec.sync import block_until

    while True:
        dead = block_until(arrived, mine, wake_r, watch, timeout=None)
        if not dead and arrived():
            return True
        if dead or os.getppid() != ppid:
            return False


def _store_reply(reply, replies: memoryview, mine) -> bool:
    """Put a pickled ``reply`` in this block's ``replies`` row and its size in ``REPLY_LEN``, or,
    too large for it, say it follows on the pipe (``REPLY_LEN = -1``); return whether it does.
    """
    size = len(reply)
    piped = size > len(replies)
    if not piped:
        replies[:size] = reply
    mine[REPLY_LEN] = -1 if piped else size
    return piped


def _relay(relayed: list, ring) -> None:
    """Wake each worker of ``relayed`` (``(control line, wake pipe's write end)``) that sleeps:
    after this worker's [GO] barrier, as main rings after its own (ordering [RELAY]).
    """
    for line, fd in relayed:
        if line[SLEEPING]:
            ring(fd)


def _main_counter(ctrl):
    """``count(seq << 1 | not_ok)``, this worker's count in broadcast round ``seq`` on main's
    line (the last of ``ctrl``), tagged with the round (``barrier.counter``).
    """
    from shmvec.barrier import counter

    return counter(ctrl.ctypes.data + (len(ctrl) - 1) * ctrl.strides[0])


def _execute(
    envs: Stepper, cmd: int, payload, arg: int, conn, block: int, pickled_obs: bool
) -> tuple[int, bytes | memoryview]:
    """Run one command on the block; return its status and pickled reply (empty when ``OK``).

    The reply is pickled here, not in the pipe's send: a result that cannot be pickled (an
    env's observation or info) is then this command's error, not a dead worker.
    """
    try:
        if cmd in WITH_DESCRIPTOR:  # a segment's descriptor follows its layout, the payload
            from multiprocessing.reduction import recv_handle

            from shmvec.segment import map_fd

            payload = (payload, map_fd(recv_handle(conn), payload.size))
        reply = envs.run(cmd, payload, arg)
        if pickled_obs and (cmd == _STEP or cmd == _RESET):
            reply = (reply, envs.pickled_results(cmd == _STEP))
        if reply is None:
            return _OK, b""
        return _REPLY, dumps(reply)
    except BaseException as exc:
        report = error_report(exc, block, envs.current, phase(cmd), cmd)
        try:
            return _ERROR, dumps(report)
        except Exception:  # the exception itself does not pickle: its report still does
            report["error"] = None
            return _ERROR, dumps(report)
