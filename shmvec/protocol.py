"""The protocol between the calling process ("main") and the workers, all in one place: the
words of a control line, the command and status codes, the handshake records, error reports.

Each block owns one 64-byte control line (8 int64 words) in the shared segment, written by
main and by the worker that steps the block; main owns the line after the last block. One
command round is:

1. main writes ``CMD``, ``ARG`` (and ``PAYLOAD`` = 1 when a pickled payload follows on the worker's
   pipe), then bumps ``GO``; if the worker's ``SLEEPING`` word is set, main writes one wake
   byte to the worker's wake pipe.
2. the worker sees ``GO`` change (spinning, or woken), reads ``CMD``, ``ARG`` and the
   payload if any, executes.
3. the worker writes its results into the shared arrays, then ``STATUS``, then sets ``DONE``
   to the value of ``GO``; if main's ``SLEEPING`` word is set, it writes one byte to the
   shared done pipe. When ``STATUS`` is not ``OK`` there is a pickled reply: in the block's row
   of the ``replies`` region when it fits (``REPLY_LEN`` says how many bytes, written before
   ``DONE``), else on its pipe after ``DONE`` (``REPLY_LEN`` = -1).

Pickled leaves (parts of a space with no fixed size, see ``layout``) ride on the same path,
and only for spaces that have them: a STEP then carries a payload, the worker's slice of each
pickled action region; every STEP and RESET reply is ``(reply, regions)``, where ``regions``
maps each pickled observation region (``"obs/<k>"``, after a step ``"final_obs/<k>"`` too)
to the worker's slice of it. Other spaces send exactly what they sent before.

The full sequence, with the wait strategy, is drawn in ``docs/architecture.md``.
"""

from __future__ import annotations

import sys
import traceback
from enum import Enum, IntEnum
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # annotations only: workers import this module before numpy and gymnasium
    from shmvec.layout import Layout, RolloutLayout

# Words of a control line (indices into its int64 words; plain ints: the hot paths index with them).
GO = 0  # command sequence number, written by main (on main's own line: a broadcast round's)
CMD = 1  # command code, written by main
PAYLOAD = 2  # 1 when a pickled payload follows on the worker's pipe
DONE = 3  # sequence number of the last finished command, written by the worker (main's line: a broadcast's count)
STATUS = 4  # result of the last command, written by the worker (unused on main's line)
SLEEPING = 5  # set while the owner of this line blocks: a worker's 1; main's, see ANY_BLOCK and rings
ARG = 6  # the command's argument (ROLLOUT_STEP: the row), written by main
REPLY_LEN = 7  # bytes of the pickled reply in the block's ``replies`` row, or -1: it follows on the pipe

# What follows a command on a worker's pipe (its payload), and what a block answers, per command.
ResetPayload = tuple[list[Any] | None, dict[str, Any] | None, Any]  # seeds, options, reset_mask slice
CallPayload = tuple[str, tuple[Any, ...], dict[str, Any]]  # method or attribute name, args, kwargs
SetAttrPayload = tuple[str, list[Any]]  # name, one value per env of the block
ActionPayload = dict[str, Any]  # pickled action region name -> the block's [n] object array
RolloutPayload = tuple["RolloutLayout", Any]  # (RolloutLayout, the mapped rollout segment), as the stepper takes it
EnvRecord = tuple[
    bytes, bool, float, int
]  # GET_STATE/SET_STATE: (env snapshot, autoreset pending, episode return, length)
Reports = list[tuple[int, dict[str, Any] | None, dict[str, Any]]]  # STEP/RESET: (env, final_info, info)

# A broadcast round (every worker, one command, no payload) is posted on main's line: its GO,
# CMD and ARG words. Its wake-ups go down a tree: main wakes workers 0 .. ROOTS - 1, and each
# worker k wakes its children, workers ROOTS + RELAY * k .. ROOTS + RELAY * k + RELAY - 1, that
# sleep (docs/architecture.md): main's share stays ROOTS wake-ups however many workers there are.
ROOTS = 2
RELAY = 4


def relay_children(block: int | None, num_workers: int) -> range:
    """The workers that worker ``block`` wakes in a broadcast round (``None``: main's)."""
    first, count = (0, ROOTS) if block is None else (ROOTS + RELAY * block, RELAY)
    return range(first, min(first + count, num_workers))


# Main's SLEEPING says which finisher rings it, made by one of these and read by `rings`: ANY_BLOCK,
# any worker; for_block(k), worker k (a round posted per block); at_count(n), in a broadcast
# round, the worker whose count makes the round's workers done n (at_count(workers): the last;
# n below that: main takes each block's results as the block finishes).
ANY_BLOCK = -1


def for_block(k: int) -> int:
    """Main's ``SLEEPING`` while it waits for worker ``k`` in particular."""
    return k + 1


def at_count(n: int) -> int:
    """Main's ``SLEEPING`` while it waits for a broadcast round's count to reach ``n`` (>= 1)."""
    return -1 - n


def rings(sleeping: int, me: int, counted: int) -> bool:
    """Whether a worker that just finished rings main, whose ``SLEEPING`` word is ``sleeping``:
    ``me`` is :func:`for_block` of the worker's block, ``counted`` the count its add made in a
    broadcast round (0 in any other round, or for a late add of an earlier round, not counted).
    """
    return sleeping == ANY_BLOCK or sleeping == me or (counted > 0 and sleeping == -1 - counted)


# A broadcast round's count, main's DONE word: the round's tag (its sequence number modulo 2**31)
# in bits 32-62, the workers whose status is not OK in bits 16-31, the workers done in bits
# 0-15. Main sets it to the tag before the round's GO; each worker adds to it only while it holds
# its own round's tag (barrier.counter: a compare-and-swap), so a late worker of an earlier
# round, whatever main saw of it, never counts into a later one.
MAX_WORKERS = (1 << 16) - 1
_TAG_BITS = (1 << 31) - 1


def count_base(seq: int) -> int:
    """Main's DONE word as broadcast round ``seq`` starts: its tag, no worker counted yet."""
    return (seq & _TAG_BITS) << 32


def counted(word: int) -> int:
    """The workers a broadcast round's count word says are done."""
    return word & 0xFFFF


def not_ok(word: int) -> int:
    """The workers a broadcast round's count word says ended with a status other than OK (a
    reply or an error report follows).
    """
    return (word >> 16) & 0xFFFF


# A block's row of the ``replies`` region: a pickled reply up to this size travels there, not on
# the pipe (a step's infos, say); a larger one (a ``render`` frame) takes the pipe.
REPLY_BYTES = 64 * 1024


class Restart(Enum):
    """What ``on_error="restart"`` does with a block that failed a command, or was replaced."""

    RAISE = "raise"  # the command's failure is raised (the envs' state is the caller's to judge)
    REPLACE = "replace"  # the block gets new envs, reset, and the round goes on without it
    RESEND = "resend"  # a replaced block gets the segment this command attached, in its Attach


class Command(IntEnum):
    """What main asks a block to do (the ``CMD`` word): the table of the protocol.

    Each member is one row. ``phase`` names it in error reports; ``handler`` is the
    :class:`~shmvec.stepper.Stepper` method that runs it (given the payload); ``reports``: its
    reply is the envs' infos (:data:`Reports`), which the worker sends with plain scalars and
    the caller merges; ``descriptor``: a segment's file descriptor follows the payload on the
    pipe; ``restart``: what a restart does (:class:`Restart`). The payload each takes is in
    the comment of its row. A new command is one row here, one ``Stepper`` method and one
    method of the vector env that sends it.
    """

    phase: str
    handler: str
    reports: bool
    descriptor: bool
    restart: Restart

    def __new__(
        cls, value: int, phase: str, handler: str, reports: bool, descriptor: bool, restart: Restart
    ) -> Command:
        member = int.__new__(cls, value)
        member._value_ = value
        member.phase, member.handler, member.reports = phase, handler, reports
        member.descriptor, member.restart = descriptor, restart
        return member

    # value, phase, Stepper method, reports, descriptor, restart
    STEP = 1, "step", "step", True, False, Restart.REPLACE  # payload (pickled action leaves only): {region: slice}
    RESET = 2, "reset", "reset", True, False, Restart.RAISE  # payload: (seeds, options, mask) of the block's envs
    CALL = 3, "call", "call", False, False, Restart.RAISE  # payload: (name, args, kwargs); reply: one result per env
    SET_ATTR = 4, "set_attr", "set_attr", False, False, Restart.RAISE  # payload: (name, values for the block's envs)
    CLOSE = 5, "close", "close", False, False, Restart.RAISE
    ROLLOUT_ATTACH = 6, "rollout attach", "attach_rollout", False, True, Restart.RESEND  # payload: a RolloutLayout
    ROLLOUT_STEP = 7, "rollout step", "step", True, False, Restart.REPLACE  # STEP into row ARG of the rollout
    INFO_ATTACH = 8, "info attach", "attach_infos", False, True, Restart.RESEND  # payload: an InfoLayout
    GET_STATE = 9, "get_state", "get_state", False, False, Restart.RAISE  # payload: env offsets; reply: EnvRecords
    SET_STATE = 10, "set_state", "set_state", False, False, Restart.RAISE  # payload: [(offset, EnvRecord), ...]


# The table's column that a worker tests on every command, as a set of plain ints.
WITH_DESCRIPTOR = frozenset(int(c) for c in Command if c.descriptor)


class Status(IntEnum):
    """How a block's last command ended (the ``STATUS`` word)."""

    OK = 0  # nothing follows
    REPLY = 1  # a pickled reply (in the replies row, or on the pipe: see REPLY_LEN)
    ERROR = 2  # a pickled error report (see error_report), the same way


def row(cmd: int) -> Command | None:
    """The table's row of command code ``cmd`` (``None`` if there is none)."""
    # A lookup by value, as Command(cmd) does: mypy reads that call as Command.__new__(value, ...).
    member = Command._value2member_map_.get(cmd)
    return member if isinstance(member, Command) else None


def phase(cmd: int) -> str:
    """The phase name of command code ``cmd`` for error reports (the number if it is unknown)."""
    member = row(cmd)
    return str(cmd) if member is None else member.phase


def restart(cmd: int) -> Restart:
    """What a restart does with a block that failed command ``cmd`` (see :class:`Restart`)."""
    member = row(cmd)
    return Restart.RAISE if member is None else member.restart


def dumps(message: Any) -> bytes | memoryview:
    """``message`` pickled for a pipe: as ``multiprocessing`` pickles it where it can, else by
    cloudpickle, which carries what the standard pickle refuses (lambdas, local classes, as in a
    wrapper's arguments). Both give a standard pickle stream that ``Connection.recv`` reads.
    """
    try:
        return ForkingPickler.dumps(message)
    except Exception:
        import cloudpickle

        return cloudpickle.dumps(message)


def carried(value: Any) -> Any:
    """``value`` if :func:`dumps` can carry it, else its reduced form: the string
    ``"<not picklable: repr(value)>"`` (an env's metadata holding a lock, say).
    """
    try:
        dumps(value)
    except Exception:
        return f"<not picklable: {value!r}>"
    return value


# The handshake, over each worker's pipe, before any command round (see docs/architecture.md).
class Spaces(NamedTuple):
    """Worker -> main: its envs are built and share these spaces.

    What the vector env reports as its own, as ``SyncVectorEnv`` does from its first env. The
    env's ``spec`` is not part of it: a vector env's spec is not its first env's (Gymnasium's
    vector envs leave it ``None`` too), and a wrapper's arguments in it may not pickle.
    """

    observation_space: Any
    action_space: Any
    metadata: dict
    render_mode: str | None

    @classmethod
    def of(cls, env: Any) -> Spaces:
        """What ``env`` (the first of a block) reports."""
        return cls(env.observation_space, env.action_space, dict(env.metadata), getattr(env, "render_mode", None))

    def pickled(self) -> bytes | memoryview:
        """The record pickled for the pipe; metadata values that cannot be pickled in their
        :func:`carried` form. Raises if the spaces themselves cannot be pickled.
        """
        try:
            return dumps(self)
        except Exception:
            return dumps(self._replace(metadata={key: carried(value) for key, value in self.metadata.items()}))

    def mismatch(self, env_index: int, expected: Spaces, expected_index: int) -> str | None:
        """Why env ``env_index``, which reported these spaces, cannot join env ``expected_index``,
        which reported ``expected`` (``None`` if their spaces agree): the one check of every
        place where envs meet (within a block, across blocks, across Ray actors).
        """
        for name in ("observation_space", "action_space"):
            found, wanted = getattr(self, name), getattr(expected, name)
            if found != wanted:
                return (
                    f"env {env_index} has {name} {found}, but env {expected_index} has {wanted}: "
                    "every env of a vector env must have the same spaces"
                )
        return None


class ConstructError(NamedTuple):
    """Worker -> main: building env ``report["env_index"]`` raised (an :func:`error_report`)."""

    report: dict[str, Any]


class Mismatch(NamedTuple):
    """Worker -> main: env ``env_index`` has spaces that differ from its block's first env."""

    env_index: int
    message: str  # from Spaces.mismatch


class WorkerOptions(SimpleNamespace):
    """The options a block applies, one record: one attribute per :class:`~shmvec.options.Options`
    field marked for the worker (same name; :meth:`~shmvec.options.Options.for_worker` makes it),
    and ``spin``, how a worker waits for a command (a :class:`~shmvec.sync.SpinPolicy`).

    Each worker process gets it as it starts (at start-up and on a restart alike) and applies
    all of it: ``worker_threads`` before it builds its envs, the rest in its
    :class:`~shmvec.stepper.Stepper`; the calling process's block applies the same record. A
    spawned worker unpickles it before it caps its threads, so it holds plain values only
    (``autoreset_mode`` as its ``AutoresetMode`` value, a string): no numpy or gymnasium type.
    """


class Attach(NamedTuple):
    """Main -> worker: map the segment laid out by ``layout``, and then each segment attached
    since the start (``attached``: ``(command, layout)`` pairs, the segments that command
    handed to every block, see ``Restart.RESEND``): their descriptors follow on the pipe, in
    that order. A worker started at start-up gets none; a replacement gets them all.
    """

    layout: Layout
    attached: list[tuple[int, Any]]


class Ready(NamedTuple):
    """Worker -> main: attached; commands may start."""


def error_report(
    exc: BaseException, block: int, env_index: int | None, phase: str, command: int | None = None
) -> dict[str, Any]:
    """A picklable description of an exception raised while block ``block`` ran its envs
    (``worker_index``: worker ``k`` steps block ``k``; the calling process's block overrides it),
    during ``phase`` (a command's name, or a stage of the start-up), and the ``command`` code
    it ran (``None`` during the start-up): what code reads, where the phase is for people.
    """
    return {
        "worker_index": block,
        "env_index": env_index,
        "phase": phase,
        "command": command,
        "exc_type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "error": exc if _own_error(exc) else None,  # raised as itself by whoever may (a SnapshotError)
    }


def _own_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of shmvec's errors (an env's snapshot refused, a bad observation):
    picklable, and meaningful to the caller as its own type.
    """
    errors = sys.modules.get("shmvec.errors")  # not imported here: a worker loads it only to raise one
    return errors is not None and isinstance(exc, errors.ShmVecError)
