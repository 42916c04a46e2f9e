"""StepHooks: the one holder of what runs as each step starts and returns."""

from shmvec.step_hooks import StepHooks


class Hook:
    def __init__(self, name, log, on_enter=None):
        self.name, self.log, self.on_enter = name, log, on_enter

    def enter(self):
        self.log.append(f"enter {self.name}")
        if self.on_enter:
            self.on_enter()

    def leave(self):
        self.log.append(f"leave {self.name}")

    def close(self):
        self.log.append(f"close {self.name}")


def test_hooks_are_entered_in_order_and_left_in_reverse():
    log, hooks = [], StepHooks()
    hooks.enter(), hooks.leave()  # none: nothing runs
    a, b = Hook("a", log), Hook("b", log)
    hooks.add(a)
    assert hooks.enter == a.enter  # one hook: its own method, no loop around it
    hooks.add(b)
    hooks.enter(), hooks.leave()
    assert log == ["enter a", "enter b", "leave b", "leave a"]
    hooks.remove(a)
    assert a not in hooks and b in hooks
    log.clear()
    hooks.close()
    assert log == ["close b"] and b not in hooks


def test_a_hook_removed_while_the_hooks_run_is_left_out_from_the_next_call():
    log, hooks = [], StepHooks()
    a = Hook("a", log)
    b = Hook("b", log, on_enter=lambda: hooks.remove(a))
    hooks.add(b), hooks.add(a)
    hooks.enter()  # b removes a, which was already due in this call
    hooks.leave()
    hooks.enter()
    assert log == ["enter b", "enter a", "leave b", "enter b"]
