"""What runs as each step starts and returns, held in one place: :class:`StepHooks`.

A vector env's step, a rollout's rows and ``recv`` call ``hooks.enter()`` as they start and
``hooks.leave()`` as they return (:class:`~shmvec.session.Session` does, around its one
after-round path). Whatever needs that beat registers here and unregisters when done: torch's
threads during a rollout (:mod:`shmvec.torch_threads`), the one automatic window
(:mod:`shmvec.slow_loop`), a ``diagnose()`` window (:mod:`shmvec.diagnose`). Nobody rewires
the step path; the holder rebinds its own ``enter`` and ``leave`` when its hooks change, so one
hook costs one call and none costs a no-op.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["StepHook", "StepHooks"]


class StepHook(Protocol):
    """One hook: :meth:`enter` as a step starts, :meth:`leave` as it returns (a failed step
    too), :meth:`close` when the vector env closes.
    """

    def enter(self) -> None: ...
    def leave(self) -> None: ...
    def close(self) -> None: ...


def _nothing() -> None:
    return None


class StepHooks:
    """The hooks of one vector env, entered in the order they were added and left in reverse.

    A hook added or removed while the hooks run takes effect from the next call: ``enter``
    and ``leave`` run over the hooks as they were when the call began.
    """

    __slots__ = ("_hooks", "enter", "leave")

    def __init__(self) -> None:
        self._hooks: tuple[StepHook, ...] = ()
        self._bind()

    def add(self, hook: StepHook) -> None:
        """Run ``hook`` around every step from the next one on."""
        self._hooks += (hook,)
        self._bind()

    def remove(self, hook: StepHook) -> None:
        """Stop running ``hook`` (nothing if it is not here)."""
        self._hooks = tuple(h for h in self._hooks if h is not hook)
        self._bind()

    def __contains__(self, hook: object) -> bool:
        return any(h is hook for h in self._hooks)

    def close(self) -> None:
        """Close every hook (the last added first) and hold none."""
        hooks, self._hooks = self._hooks, ()
        self._bind()
        for hook in reversed(hooks):
            hook.close()

    def _bind(self) -> None:
        hooks = self._hooks
        if not hooks:
            self.enter = self.leave = _nothing
        elif len(hooks) == 1:
            self.enter, self.leave = hooks[0].enter, hooks[0].leave
        else:
            backwards = hooks[::-1]

            def enter() -> None:
                for hook in hooks:
                    hook.enter()

            def leave() -> None:
                for hook in backwards:
                    hook.leave()

            self.enter, self.leave = enter, leave
