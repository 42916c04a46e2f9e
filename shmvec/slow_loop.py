"""The one automatic warning: a window of the user's rollouts, measured once, and its rule.

A user who never calls :meth:`ShmVecEnv.diagnose` should still hear when the loop around the
vector env starves its workers. :class:`SlowLoopWatch`, a step hook (:mod:`shmvec.step_hooks`),
waits until the loop runs in its steady rhythm (torch's threads for the rollouts settled, see
:mod:`shmvec.torch_threads`: a window taken before that would see the spinning threads that
``torch_threads="auto"`` is about to quiet), measures one window of at least ``WINDOW_S``
seconds of the loop's rollouts, and warns once if :func:`warning_text` finds the clear case.

Only the time inside the rollouts' rhythm is judged: the updates between rollouts are left out
(torch's threads working on an update starve nobody), and a loop with no rhythm, or one that
breaks it inside the window (a harness that pauses for seconds between its own stretches of
steps, while other processes run), is not judged at all: its gaps are not the workers' steps.
The warning is said as the next step starts, before it runs, so that a warning turned into an
error loses no step. Then the watch leaves the step hooks. ``ShmVecEnv(warn_slow_loop=False)``
never measures.
"""

from __future__ import annotations

from collections.abc import Callable

from shmvec.checks import usable_cores
from shmvec.diagnose import Diagnosis, LoopWindow
from shmvec.errors import warn_at_caller
from shmvec.step_hooks import StepHooks
from shmvec.torch_threads import TorchThreads

__all__ = ["SlowLoopWarning", "SlowLoopWatch", "warning_text"]

# The window: rhythmic steps before it opens (the loop's first steps are not its steady
# state), and the seconds and steps it takes (several rollouts of a PPO loop).
WARMUP_STEPS = 64
WINDOW_S = 2.0
WINDOW_STEPS = 64
# The rule: the workers waited for a core longer than this share of their time on one, and a
# cause other than their own turns with the loop on the cores is seen.
WARN_SHARE = 1.0


class SlowLoopWarning(UserWarning):
    """Said at most once per vector env, when a measured window of the loop shows its workers
    starved by the calling process's other threads or by other processes (with the numbers
    and the fix); ``ShmVecEnv(warn_slow_loop=False)`` silences it.
    """


def warning_text(diagnosis: Diagnosis) -> str | None:
    """The warning's text, on the clearest case only: the workers waited for a core longer
    than they ran, and the calling process's other threads or other processes took the cores
    (``None`` otherwise: workers that only take turns with the loop on too few cores are not
    warned about; :meth:`Diagnosis.causes` still names that case).
    """
    if not diagnosis.workers or diagnosis.starved_share <= WARN_SHARE:
        return None
    numbers, seen = diagnosis.starvation(diagnosis.wall_s or 1e-9)
    return "; ".join([numbers, *seen]) if seen else None


class SlowLoopWatch:
    """A step hook that measures one window of the loop's rollouts and warns on a clear case.

    Parameters
    ----------
    threads : TorchThreads
        The vector env's reader of the loop's rhythm; the window opens once it is
        :attr:`~TorchThreads.settled` on a rhythm, pauses after each rollout's last step, and
        is dropped if the rhythm breaks.
    hooks : StepHooks
        The vector env's step hooks, where this watch and its window are registered; both
        leave them once the window is judged or dropped.
    workers : callable
        The vector env's worker processes now (``WorkerPool.worker_clocks``).
    """

    __slots__ = ("threads", "hooks", "workers", "window", "warmup")

    def __init__(self, threads: TorchThreads, hooks: StepHooks, workers: Callable[[], list[tuple[int, float]]]) -> None:
        self.threads, self.hooks, self.workers = threads, hooks, workers
        self.window: LoopWindow | None = None  # while it is open
        self.warmup = WARMUP_STEPS  # rhythmic steps before it opens

    def enter(self) -> None:
        window, threads = self.window, self.threads
        if window is None:
            if threads.settled:
                if not threads.period:
                    self._retire()  # no rhythm: nothing to judge
                    return
                self.warmup -= 1
                if not self.warmup:
                    self.window = window = LoopWindow(self.workers, usable_cores())
                    self.hooks.add(window)  # (it times steps from the next one on)
                    window.start()
        elif not threads.period:
            self._retire()  # the rhythm broke inside the window: its gaps are not the workers' steps
        elif window.steps >= WINDOW_STEPS and window.elapsed() >= WINDOW_S:
            self._judge(window)  # before this step runs: a warning turned into an error costs no step
        elif window.paused:
            window.resume()  # a rollout's first step

    def leave(self) -> None:
        window = self.window
        if window is not None and self.threads.rollout_done:
            window.pause()  # the update that follows is no part of the steps' time

    def close(self) -> None:
        return None

    def _judge(self, window: LoopWindow) -> None:
        diagnosis = window.stop()
        self._retire()
        text = warning_text(diagnosis)
        if text is not None:
            warn_at_caller(
                f"shmvec: this loop starves its vector env's workers. Over {diagnosis.steps} steps "
                f"({diagnosis.wall_s:.1f} s): {text}. envs.diagnose() measures a window of your choice "
                "(docs/benchmarks.md, 'Why is my loop slow?'); ShmVecEnv(warn_slow_loop=False) silences this",
                SlowLoopWarning,
            )

    def _retire(self) -> None:
        """Measured (or nothing to measure): out of the step path, with the window."""
        if self.window is not None:
            self.hooks.remove(self.window)
            self.window = None
        self.hooks.remove(self)
        self.warmup = 0
