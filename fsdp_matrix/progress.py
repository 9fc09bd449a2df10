"""Progress lines for long commands: what is being done, how far along, and the elapsed time.

A command that waits on a subprocess (uv resolving a 3 GB torch, a torchrun launch importing transformers) can be
silent for minutes. A Heartbeat prints its current status at least every ``interval`` seconds while anything is
under way, so no long command goes quiet for more than that.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, List, Optional, TextIO

INTERVAL_S = 10.0
"""Longest silence allowed by the project's rules; the heartbeat speaks a little before it runs out."""


def fmt_seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Heartbeat:
    """Prints ``[label] status (elapsed)`` when nothing was printed through it for ``interval`` seconds.

    Use as a context manager. ``status`` is what the next heartbeat says; ``say`` prints a line now (and counts as
    a heartbeat). Lines go to ``stream`` (stdout by default), flushed, so they show under nox and in CI logs.
    Heartbeats nest (an upgrade's around an install's): only the innermost one beats, the most specific status.
    """

    _active: List[Heartbeat] = []

    def __init__(
        self,
        label: str,
        status: str = "working",
        *,
        interval: float = INTERVAL_S - 2,
        stream: Optional[TextIO] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.status, self.interval, self.clock = label, status, interval, clock
        self.stream = stream
        self.start = clock()
        self._last = self.start
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def say(self, message: str) -> None:
        with self._lock:
            print(f"[{self.label}] {message} ({fmt_seconds(self.elapsed)})", file=self.stream or sys.stdout, flush=True)
            self._last = self.clock()

    def update(self, status: str, say: bool = False) -> None:
        self.status = status
        if say:
            self.say(status)

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval)):
            innermost = Heartbeat._active[-1] if Heartbeat._active else self
            if innermost is not self:
                self._last = self.clock()
            elif self.clock() - self._last >= self.interval:
                self.say(self.status)

    def __enter__(self) -> Heartbeat:
        Heartbeat._active.append(self)
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self in Heartbeat._active:
            Heartbeat._active.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
