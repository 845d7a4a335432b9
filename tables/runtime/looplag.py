"""How long the event loop stalls: a small task asks to wake every `TICK_S` and measures how
late it wakes. A worker whose loop stalls answers nothing meanwhile (its web view, its
heartbeats to the group, the fetches), so the longest stall is a health figure of its own:
`tandem_event_loop_stall_seconds` in `/metrics`, `loop` in `/tandem/`.

    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    lag.longest()        # the longest stall in the last WINDOW_S seconds
    lag.worst            # ... since the worker started
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

log = logging.getLogger(__name__)

TICK_S = 0.05  # how often the task asks to wake (a stall shorter than this is not seen)
WINDOW_S = 10  # the gauge is the longest stall in this many past seconds
REPORT_S = 0.5  # a stall this long is logged (at most one line per WINDOW_S)


class LoopLag:
    """The event loop's stalls, as seen by a task that wakes every `tick_s`."""

    def __init__(self, tick_s: float = TICK_S, window_s: int = WINDOW_S) -> None:
        self.tick_s = tick_s
        self.window_s = window_s
        self.worst = 0.0  # the longest stall since the task started
        self.samples = 0
        self._by_second: deque[tuple[int, float]] = deque()  # (whole second, longest stall in it)
        self._reported_at = float("-inf")

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.tick_s)
            woke = time.monotonic()
            self.observe(max(0.0, woke - asked - self.tick_s), woke)

    def observe(self, stall_s: float, now: float) -> None:
        """One wake-up `stall_s` seconds late, at monotonic time `now`."""
        self.samples += 1
        self.worst = max(self.worst, stall_s)
        second = int(now)
        if self._by_second and self._by_second[-1][0] == second:
            if stall_s > self._by_second[-1][1]:
                self._by_second[-1] = (second, stall_s)
        else:
            self._by_second.append((second, stall_s))
        while self._by_second and self._by_second[0][0] <= second - self.window_s:
            self._by_second.popleft()
        if stall_s >= REPORT_S and now - self._reported_at >= self.window_s:
            self._reported_at = now
            log.warning("tandem: the event loop stalled %.2f s (nothing else ran meanwhile)", stall_s)

    def longest(self, now: float | None = None) -> float:
        """The longest stall in the last `window_s` seconds (0 when none was seen)."""
        second = int(time.monotonic() if now is None else now)
        return max((s for at, s in self._by_second if at > second - self.window_s), default=0.0)


def running_tasks() -> int | None:
    """Tasks on the running event loop (None when called outside one)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return None
