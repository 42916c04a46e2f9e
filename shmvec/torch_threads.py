"""Torch's intra-op threads in the calling process while a training loop collects a rollout.

torch's pip wheels run their intra-op pool on GNU OpenMP, whose threads spin for milliseconds
after every parallel op before they sleep. In a loop that alternates a policy's forward pass
with a vector env's step, those threads spin through every step, on the cores the workers need:
a worker per core then gets half a core (``docs/benchmarks.md``, "In a training loop with
torch"). The forward pass of a rollout is small, and gains little from the pool; the update, between
rollouts, is where the pool pays.

:class:`TorchThreads` learns the loop's rhythm from the gaps between ``step`` calls: a run of
short gaps (forward passes) is a rollout, a long gap is an update. Once two rollouts in a row
had the same length, it lowers torch's threads as the next rollout starts (the first step after
a long gap) and gives the user's number back as the rollout's last step returns, so that the update (and
the forward pass that bootstraps it) runs as the user set it. A loop with no such rhythm (an
off-policy loop that updates after every step) is left alone.

Nothing here imports torch: a loop that never imported it is never touched.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from shmvec.errors import warn_at_caller

__all__ = ["TorchThreads", "ThreadsNotice"]

# A gap between steps is "long" past this many times the typical short gap, and past LONG_S;
# a long gap is an update unless it is shorter than UPDATE_SHARE of the updates seen: the loop's
# thread, descheduled for a time slice or two (10-20 ms) while the workers and torch's threads
# share the cores, is not an update. A rollout must be at least MIN_PERIOD steps for the rhythm
# to count.
LONG_RATIO = 50.0
LONG_S = 10e-3
UPDATE_SHARE = 0.5
MIN_PERIOD = 8
# A loop that shows no rhythm after this many updates, or this many steps without one, has none.
GIVE_UP_UPDATES = 4
GIVE_UP_STEPS = 1000

_told = False  # the one line is said once per process


class ThreadsNotice(UserWarning):
    """Said once per process, the first time a vector env lowers torch's threads for a rollout."""


class TorchThreads:
    """Torch's intra-op threads while a rollout is collected: ``threads`` (``None``: leave torch alone).

    Call :meth:`enter` as a step starts and :meth:`leave` as it returns, from the thread that
    runs the loop (torch's thread count is that thread's OpenMP setting); :meth:`close` gives
    the user's threads back if a rollout was cut short. The rhythm is read with ``None`` too:
    the automatic window (:mod:`shmvec.slow_loop`) leaves the updates out by it.
    """

    __slots__ = (
        "threads",
        "period",
        "last",
        "count",
        "updates",
        "short",
        "update",
        "left",
        "lowered",
        "decided",
        "user",
    )

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self.period = 0  # steps of the last two rollouts, where they agreed (0: no rhythm)
        self.last = 0  # steps of the last rollout
        self.count = 0  # steps since the last long gap
        self.updates = 0  # long gaps seen
        self.short = 0.0  # typical gap between the steps of a rollout (seconds)
        self.update = 0.0  # typical gap of an update (seconds; 0 until one was seen)
        self.left: float | None = None  # perf_counter() as the last step returned
        self.lowered = False
        self.decided = False  # a rhythm was found, and torch's threads lowered or found low enough
        self.user = 0  # torch's threads before they were lowered

    def enter(self) -> None:
        left = self.left
        if left is None:
            self.count = 1
            return
        gap = time.perf_counter() - left
        if self.short and gap > LONG_S and gap > LONG_RATIO * self.short:
            if gap < UPDATE_SHARE * self.update:
                self.count += 1  # a hiccup inside the rollout, not an update
                return
            # An update ran: the rollout before it had `count` steps, and a new one starts here.
            self.update = gap if gap > self.update else 0.9 * self.update + 0.1 * gap
            self.updates += 1
            count = self.count
            self.period = count if count == self.last and count >= MIN_PERIOD else 0
            self.last, self.count = count, 1
            if self.period and not self.lowered:
                self._lower()
            return
        self.short = gap if not self.short else 0.9 * self.short + 0.1 * gap
        self.count += 1

    def leave(self) -> None:
        self.left = time.perf_counter()
        if self.lowered and self.count >= self.period:
            self.restore()  # the rollout's last step: the update runs with the user's threads

    @property
    def settled(self) -> bool:
        """Whether the rollouts' threads are decided: the rhythm was found (and torch's threads
        lowered, unless there was nothing to lower), or no rhythm was found in time.
        """
        return self.decided or self.updates >= GIVE_UP_UPDATES or self.count >= GIVE_UP_STEPS

    @property
    def rollout_done(self) -> bool:
        """Whether the step that just returned was a rollout's last (an update follows)."""
        return bool(self.period) and self.count >= self.period

    def _lower(self) -> None:
        self.decided = True
        torch: Any = sys.modules.get("torch")
        if self.threads is None or torch is None or not hasattr(torch, "get_num_threads"):
            return
        user = torch.get_num_threads()
        if user <= self.threads:
            return
        torch.set_num_threads(self.threads)
        self.user, self.lowered = user, True
        global _told
        if not _told:
            _told = True
            warn_at_caller(
                f"shmvec: torch runs on {self.threads} intra-op thread(s) while a rollout of {self.period} steps "
                f"is collected, and on its {user} between rollouts, so that its spinning threads leave the "
                "workers their cores; ShmVecEnv(torch_threads=None) turns this off",
                ThreadsNotice,
            )

    def restore(self) -> None:
        """Give torch the user's threads back, if they are lowered."""
        if self.lowered:
            self.lowered = False
            torch: Any = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(self.user)

    close = restore
