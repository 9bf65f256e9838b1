"""tpunb.transport.fanout: one deadline, one Ctrl-C rule and one partial-failure result for every fan-out."""
from __future__ import annotations

import _thread
import threading
import time

import pytest

from tests.conftest import interrupt_main_unseen_when, main_thread_asleep
from tpunb.transport.fanout import FanOutTimeout, fan_out


def test_values_come_in_key_order_whatever_order_they_finish_in():
    gates = {k: threading.Event() for k in "abc"}

    def one(key: str) -> str:
        if key != "c":
            gates[chr(ord(key) + 1)].wait(5)  # a waits for b, b for c: they finish c, b, a
        gates[key].set()
        return key.upper()

    result = fan_out("abc", one)
    assert result.ok and result.values() == ["A", "B", "C"] and list(result.succeeded) == ["a", "b", "c"]


def test_one_key_failing_keeps_the_others_results_and_raises_only_when_asked():
    def one(key: int) -> int:
        if key % 2:
            raise ValueError(f"host {key} is odd")
        return key * 10

    result = fan_out(range(5), one)
    assert result.succeeded == {0: 0, 2: 20, 4: 40}
    assert [str(e) for e in result.failed.values()] == ["host 1 is odd", "host 3 is odd"]
    with pytest.raises(ValueError, match="host 1 is odd"):
        result.values()


def test_a_key_past_the_deadline_fails_and_its_late_value_is_handed_over():
    release, handed = threading.Event(), []
    handed_event = threading.Event()

    def one(key: str) -> str:
        if key == "slow":
            release.wait(10)
        if key == "broken":
            raise ConnectionRefusedError("refused")
        return f"connection to {key}"

    def late(value: str) -> None:
        handed.append(value)
        handed_event.set()

    started = time.monotonic()
    result = fan_out(["fast", "slow", "broken"], one, deadline=0.3, late=late)
    assert time.monotonic() - started < 5
    assert result.succeeded == {"fast": "connection to fast"}
    assert isinstance(result.failed["slow"], FanOutTimeout) and "within 0.3 s" in str(result.failed["slow"])
    assert str(result.failed["broken"]) == "refused"  # (a failure beside it does not change what the timeout says)
    release.set()
    assert handed_event.wait(5) and handed == ["connection to slow"]  # closed by the caller's rule, not leaked


def test_once_one_fails_the_others_get_only_the_grace():
    release = threading.Event()

    def one(key: str) -> str:
        if key == "broken":
            raise RuntimeError("no environment")
        release.wait(10)
        return key

    started = time.monotonic()
    result = fan_out(["broken", "stuck"], one, after_failure=0.2)
    release.set()
    assert time.monotonic() - started < 5
    assert str(result.failed["broken"]) == "no environment"
    assert "0.2 s after another failed" in str(result.failed["stuck"])


def test_ctrl_c_stops_the_wait_and_hands_over_what_was_got_and_what_comes_later():
    release, handed, all_handed = threading.Event(), [], threading.Event()

    def one(key: str) -> str:
        if key == "interrupts":
            _thread.interrupt_main()  # the user's Ctrl-C, while the kernel waits
            release.wait(10)
        return key

    def late(value: str) -> None:
        handed.append(value)
        if len(handed) == 2:
            all_handed.set()

    with pytest.raises(KeyboardInterrupt):
        fan_out(["quick", "interrupts"], one, late=late)
    release.set()
    assert all_handed.wait(5) and sorted(handed) == ["interrupts", "quick"]


def test_a_ctrl_c_that_woke_no_sleep_still_stops_the_wait_at_once():
    """A SIGINT whose C handler ran just before the waiting thread fell asleep, or on another thread,
    wakes no sleep (``interrupt_main_unseen_when`` sends exactly that). The wait raises it within
    WAKE, not once the slowest host answers (here 30 s later)."""
    release, inside = threading.Event(), threading.Event()

    def one(key: str) -> bool:
        inside.set()  # the kernel's thread is in fan_out from here until it returns
        return release.wait(30)

    sent = interrupt_main_unseen_when(lambda: inside.is_set() and main_thread_asleep())
    try:
        with pytest.raises(KeyboardInterrupt):
            fan_out(["slow", "slower"], one)
        assert time.perf_counter() - sent["at"] < 2
    finally:
        release.set()


def test_ticks_run_on_the_waiting_thread_and_workers_are_capped():
    running, most, lock = [0], [0], threading.Lock()
    release, ticks = threading.Event(), []

    def one(key: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(10)
        with lock:
            running[0] -= 1
        return key

    def tick() -> None:
        ticks.append(threading.current_thread())
        if len(ticks) == 3:
            release.set()

    result = fan_out(range(6), one, workers=2, tick=0.01, on_tick=tick)
    assert result.values() == list(range(6)) and most[0] == 2
    assert ticks and all(t is threading.current_thread() for t in ticks)
