"""The one automatic warning: a window of the user's loop, measured once, and a word on a clear case.

A user who never calls :meth:`ShmVecEnv.diagnose` should still hear when the loop around the
vector env starves its workers. :class:`SlowLoopWatch` waits until the loop is in its steady
rhythm (torch's threads for the rollouts settled, see :mod:`shmvec.collect_threads`: a window
taken before that would see the spinning threads that ``torch_threads="auto"`` is about to
quiet), measures one window of at least ``WINDOW_S`` seconds of the user's own rollouts (the
updates between them left out: torch's threads working on an update starve nobody), and warns
once if :meth:`~shmvec.loop_timing.Diagnosis.warning` finds the clear case: the workers waited
for a core longer than they ran, and something other than their own turns with the loop took
the cores. The warning is said as the next step starts, before it runs, so that a warning
turned into an error loses no step. Then the watch takes itself out of the step path.
``ShmVecEnv(warn_slow_loop=False)`` never measures.
"""

from __future__ import annotations

import weakref
from typing import Any

from shmvec.collect_threads import CollectThreads
from shmvec.errors import warn_at_caller
from shmvec.loop_timing import LoopWindow, StepHooks

__all__ = ["SlowLoopWarning", "SlowLoopWatch"]

# The window: steps after the rhythm settled before it opens (the loop's first steps are not
# its steady state), and the seconds of steps it takes (several rollouts of a PPO loop: the
# updates between them are left out).
WARMUP_STEPS = 64
WINDOW_S = 2.0
WINDOW_STEPS = 64


class SlowLoopWarning(UserWarning):
    """Said at most once per vector env, when a measured window of the loop shows its workers
    starved by the calling process's other threads or by other processes (with the numbers
    and the fix); ``ShmVecEnv(warn_slow_loop=False)`` silences it.
    """


class SlowLoopWatch:
    """Step hooks around ``hooks`` that measure one window of the loop and warn on a clear case.

    Parameters
    ----------
    hooks : CollectThreads
        The vector env's hooks; the window opens once they are :attr:`~CollectThreads.settled`.
    owner : Diagnosable
        The vector env (held weakly): it makes the window, and gets ``hooks`` back as its
        ``_around_step`` once the window is judged.
    """

    __slots__ = ("hooks", "owner", "current", "window", "warmup")

    def __init__(self, hooks: CollectThreads, owner: Any) -> None:
        self.hooks = hooks
        self.owner = weakref.ref(owner)
        self.current: StepHooks = hooks  # hooks, or the window's clock around them
        self.window: LoopWindow | None = None  # while it is open
        self.warmup = WARMUP_STEPS  # settled steps before it opens (0: opened, or never to be)

    def enter(self) -> None:
        window = self.window
        if window is not None:
            if window.steps >= WINDOW_STEPS and window.elapsed() >= WINDOW_S:
                self._judge(window)  # before this step runs: a warning turned into an error costs no step
        elif self.warmup:
            if self.hooks.settled:
                self.warmup -= 1
                if not self.warmup:
                    self._open()
        else:
            self._unhook()  # judged while diagnose() wrapped these hooks: out of the step path now
        self.current.enter()
        window = self.window
        if window is not None and window.paused:
            window.resume()  # a rollout's first step

    def leave(self) -> None:
        self.current.leave()
        if self.window is not None and self.hooks.rollout_done:
            self.window.pause()  # the update that follows is no part of the steps' time

    def close(self) -> None:
        self.hooks.close()

    def _open(self) -> None:
        owner = self.owner()
        if owner is None:
            return
        self.window = window = owner._window()
        self.current = window.around(self.hooks)
        window.start()

    def _judge(self, window: LoopWindow) -> None:
        diagnosis = window.stop()
        self.current, self.window = self.hooks, None
        self._unhook()
        text = diagnosis.warning()
        if text is not None:
            warn_at_caller(
                f"shmvec: this loop starves its vector env's workers. Over {diagnosis.steps} steps "
                f"({diagnosis.wall_s:.1f} s): {text}. envs.diagnose() measures a window of your choice "
                "(docs/benchmarks.md, 'Why is my loop slow?'); ShmVecEnv(warn_slow_loop=False) silences this",
                SlowLoopWarning,
            )

    def _unhook(self) -> None:
        """Measured once: the step path is the hooks' alone again."""
        owner = self.owner()
        if owner is not None and owner._around_step is self:
            owner._around_step = self.hooks
