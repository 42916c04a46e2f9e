"""A dependency-free progress bar on stderr: one redrawn line on a terminal, plain lines elsewhere."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``75`` -> ``"1:15"``; ``4000`` -> ``"1:06:40"``."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Counts finished items and shows what runs now and about how long is left.

    Parameters
    ----------
    estimates : list of float
        Planned seconds of each item, in order; the time left is the planned time of the
        items to come, scaled by how the finished ones compared with their plan.
    stream : file, default sys.stderr
    enabled : bool, default True
        ``False`` prints nothing.
    """

    def __init__(self, estimates: list[float], stream: TextIO | None = None, enabled: bool = True) -> None:
        self.estimates = list(estimates)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self.start_time = time.perf_counter()
        self.planned_done = 0.0

    @property
    def total(self) -> int:
        return len(self.estimates)

    def eta(self) -> float:
        spent = time.perf_counter() - self.start_time
        rest = sum(self.estimates[self.done :])
        scale = spent / self.planned_done if self.planned_done > 0 else 1.0
        return rest * scale

    def _bar(self, width: int) -> str:
        filled = int(width * self.done / self.total) if self.total else width
        return "#" * filled + "." * (width - filled)

    def show(self, label: str) -> None:
        """Announce the item about to run."""
        if not self.enabled:
            return
        text = f"[{self._bar(20)}] {self.done}/{self.total}  ~{format_duration(self.eta())} left  {label}"
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + text[:width].ljust(width))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def advance(self) -> None:
        """Mark the current item finished."""
        if self.done < self.total:
            self.planned_done += self.estimates[self.done]
            self.done += 1

    def finish(self, message: str = "") -> None:
        """Close the bar's line and print ``message``."""
        if not self.enabled:
            return
        spent = format_duration(time.perf_counter() - self.start_time)
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + f"[{self._bar(20)}] {self.done}/{self.total} in {spent}".ljust(width) + "\n")
        if message:
            self.stream.write(message + "\n")
        self.stream.flush()
