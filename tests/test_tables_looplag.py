"""The event loop's stall gauge (tables/runtime/looplag.py): a real loop blocked on purpose."""

from __future__ import annotations

import asyncio
import time

from tables.runtime.looplag import LoopLag


def test_a_blocked_loop_is_seen_as_a_stall_of_about_its_length() -> None:
    lag = LoopLag(tick_s=0.01)

    async def block_then_idle() -> None:
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # the loop does nothing else meanwhile: what a long batch or a restore does
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(block_then_idle())
    assert 0.25 <= lag.longest() <= 0.3 + 0.2, lag.longest()  # bounded generously: a shared machine
    assert lag.worst == lag.longest() and lag.samples > 5


def test_the_gauge_forgets_a_stall_once_the_window_has_passed_it() -> None:
    lag = LoopLag(window_s=10)
    lag.observe(0.8, now=100.2)
    lag.observe(0.01, now=105.0)
    assert lag.longest(now=105.5) == 0.8
    assert lag.longest(now=109.9) == 0.8
    lag.observe(0.02, now=110.3)  # 10 s after the stall's second: it has left the window
    assert lag.longest(now=110.3) == 0.02
    assert lag.worst == 0.8  # ... but not the worst since the start
    assert lag.longest(now=200.0) == 0.0
