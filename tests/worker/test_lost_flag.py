"""LostFlag: the lease-lost flag of a run, an Event made only when someone waits (docs/reference/semantics.md#leases).

Real threads: a waiter blocked in ``wait`` is woken by ``set`` from another
thread, a ``set`` before the wait is seen at once, and many racing pairs never
leave a waiter asleep.
"""

from __future__ import annotations

import threading
import time

from django_fq.worker.context import LeaseState, LostFlag


def test_set_before_wait_is_seen_without_blocking():
    flag = LostFlag()
    assert not flag.is_set()
    flag.set()
    assert flag.is_set()
    assert flag.wait(10) is True


def test_wait_times_out_false_when_never_set():
    flag = LostFlag()
    started = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.04
    assert flag.wait(-1) is False  # a deadline already past: no wait at all


def test_set_from_another_thread_wakes_the_waiter():
    flag = LostFlag()
    waiting = threading.Event()
    woke: list[bool] = []

    def waiter():
        waiting.set()
        woke.append(flag.wait(30))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10)
    flag.set()
    thread.join(10)
    assert not thread.is_alive() and woke == [True]


def test_racing_set_and_wait_never_leave_a_waiter_asleep():
    flags = [LostFlag() for _ in range(300)]
    results: list[bool] = []
    lock = threading.Lock()

    def waiter(flag: LostFlag):
        got = flag.wait(30)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=waiter, args=(f,)) for f in flags]
    for thread in threads:
        thread.start()
    for flag in flags:
        flag.set()
    for thread in threads:
        thread.join(30)
    assert results == [True] * len(flags)


def test_lease_state_mark_lost_sets_the_flag_once():
    state = LeaseState(deadline=0)
    seen: list[int] = []
    state.on_lost = lambda: seen.append(1)
    assert state.mark_lost("cancelled") is True
    assert state.mark_lost("expired") is False
    assert state.lost.is_set() and state.lost.wait(0) and state.lost_reason() == "cancelled" and seen == [1]
