"""Where an `auto` worker belongs (taskline.placement): pinned while busy, free while idle and
while its own threads keep a whole CPU busy, moved off a CPU other processes crowd while another
idles, left alone on a loaded host; and the real changes, in a child process, reach every
thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from taskline import placement
from taskline.placement import FREE, MOVE, PIN, STAY, Decision, Sample, decide

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


def window(own: float, idle: dict[int, float]) -> tuple[Sample, Sample]:
    """Two samples one second apart: the process used `own` CPUs, each CPU was idle its share."""
    before = Sample(10.0, 5.0, {cpu: (0, 0) for cpu in idle})
    after = Sample(11.0, 5.0 + own, {cpu: (round(100 * share), 100) for cpu, share in idle.items()})
    return before, after


def test_a_crowded_cpu_is_left_for_the_idlest_when_the_coin_says_so() -> None:
    before, after = window(0.45, {0: 0.02, 1: 0.6, 2: 0.85})
    assert decide(before, after, 0, {0, 1, 2}, coin=0.2) == Decision(MOVE, 2)
    assert decide(before, after, 0, {0, 1, 2}, coin=0.7) == Decision(STAY)


def test_a_loaded_host_moves_nothing() -> None:
    before, after = window(0.45, {0: 0.05, 1: 0.1})
    assert decide(before, after, 0, {0, 1}, coin=0.0) == Decision(STAY)


def test_a_cpu_busy_with_the_process_itself_is_not_crowded() -> None:
    before, after = window(0.85, {0: 0.05, 1: 0.9})
    assert decide(before, after, 0, {0, 1}, coin=0.0) == Decision(STAY)


def test_a_process_that_keeps_its_cpu_busy_is_freed_and_stays_free() -> None:
    before, after = window(0.95, {0: 0.0, 1: 0.9})
    assert decide(before, after, 0, {0, 1}, coin=0.0) == Decision(FREE)
    for own in (0.85, 1.4):  # near a whole CPU, or above one: free
        before, after = window(own, {0: 0.3, 1: 0.3})
        assert decide(before, after, 0, {0, 1}, coin=0.0, pinned=False) == Decision(STAY)


def test_an_idle_process_is_freed_and_a_busy_one_pinned_again() -> None:
    idle = window(0.01, {0: 0.95, 1: 0.97})
    assert decide(*idle, 0, {0, 1}, coin=0.0) == Decision(FREE)
    assert decide(*idle, 0, {0, 1}, coin=0.0, pinned=False) == Decision(STAY)
    busy = window(0.3, {0: 0.6, 1: 0.9})
    assert decide(*busy, 0, {0, 1}, coin=0.0, pinned=False) == Decision(PIN)
    assert decide(*busy, 0, {0, 1}, coin=0.0) == Decision(STAY)
    between = window(0.15, {0: 0.8, 1: 0.9})  # the band between: as it is
    assert decide(*between, 0, {0, 1}, coin=0.0) == Decision(STAY)
    assert decide(*between, 0, {0, 1}, coin=0.0, pinned=False) == Decision(STAY)


def test_only_cpus_the_process_may_use_are_targets() -> None:
    before, after = window(0.4, {0: 0.02, 1: 0.05, 5: 0.99})
    assert decide(before, after, 0, {0, 1}, coin=0.0) == Decision(STAY)


def test_no_time_passed_decides_nothing() -> None:
    sample = Sample(3.0, 1.0, {0: (0, 0)})
    assert decide(sample, sample, 0, {0}, coin=0.0) == Decision(STAY)


def test_the_readings_are_this_machines() -> None:
    first = placement.read()
    sum(i * i for i in range(300_000))  # some CPU time of this process
    second = placement.read()
    assert set(os.sched_getaffinity(0)) <= set(second.cpus)
    assert second.own_s > first.own_s and second.at > first.at
    shares = placement.idle_shares(first, second)
    assert all(0.0 <= share <= 1.0 for share in shares.values())
    assert all(idle <= total for idle, total in second.cpus.values())


CHILD = textwrap.dedent("""
    import json, os, threading
    from taskline import affinity
    from taskline.placement import Placement, Sample
    allowed = os.sched_getaffinity(0)
    first, last = min(allowed), max(allowed)
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in threads:
        thread.start()

    def placed():
        return sorted({tuple(sorted(os.sched_getaffinity(t))) for t in affinity.threads()})

    def cpus(idle_first, idle_last, ticks):
        return {first: (idle_first, ticks), last: (idle_last, ticks)}

    samples = iter([
        Sample(0.0, 0.0, cpus(0, 0, 0)),
        Sample(1.0, 0.4, cpus(60, 90, 100)),     # busy: pinned
        Sample(2.0, 0.41, cpus(155, 185, 200)),  # idle: free
        Sample(3.0, 0.81, cpus(215, 275, 300)),  # busy again: pinned
        Sample(4.0, 1.11, cpus(217, 365, 400)),  # crowded: to `last`
        Sample(5.0, 1.11, cpus(217, 365, 400)),  # a new CPU's first look
        Sample(6.0, 2.11, cpus(217, 365, 500)),  # its own threads, a whole CPU: free
        Sample(7.0, 3.31, cpus(217, 365, 600)),  # more than one CPU now: still free
    ])
    changes = []
    watch = Placement(first, allowed, lambda cpus, change: changes.append([cpus, change]),
                      sample=lambda: next(samples), coin=lambda: 0.0,
                      oversubscribed=lambda: False)
    looks = [[watch.run_once().action, placed()] for _ in range(8)]
    stop.set()
    print(json.dumps({"looks": looks, "changes": changes, "allowed": sorted(allowed),
                      "first": first, "last": last}))
""")




def test_every_change_reaches_every_thread(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=env, check=True, timeout=30)
    result = json.loads(out.stdout)
    if len(result["allowed"]) < 2:
        pytest.skip("needs two CPUs")
    first, last, allowed = [result["first"]], [result["last"]], result["allowed"]
    assert result["looks"] == [  # every thread, each time; a worker starts free
        ["stay", [allowed]], ["pin", [first]], ["free", [allowed]], ["pin", [first]],
        ["move", [last]], ["stay", [last]], ["free", [allowed]], ["stay", [allowed]]]
    assert result["changes"] == [[first, "pin"], [None, "free"], [first, "pin"],
                                 [last, "move"], [None, "free"]]


def test_an_oversubscribed_host_pins_nothing() -> None:
    busy = window(0.4, {0: 0.3, 1: 0.3})
    assert decide(*busy, 0, {0, 1}, coin=0.0, pinned=False, oversubscribed=True) == Decision(STAY)
    assert decide(*busy, 0, {0, 1}, coin=0.0, oversubscribed=True) == Decision(FREE)


def test_the_host_is_read_only_for_a_busy_worker_and_frees_it() -> None:
    looks = iter([window(0.01, {0: 0.9, 1: 0.9})[0], window(0.01, {0: 0.9, 1: 0.9})[1],
                  Sample(12.0, 5.41, {0: (150, 200), 1: (160, 200)})])
    asked: list[bool] = []

    def oversubscribed() -> bool:
        asked.append(True)
        return True

    changes: list[object] = []
    watch = placement.Placement(0, {0, 1}, lambda cpus, change: changes.append(change),
                                sample=lambda: next(looks), coin=lambda: 0.0,
                                oversubscribed=oversubscribed)
    assert watch.run_once() == Decision(STAY)  # the first sample
    assert watch.run_once() == Decision(STAY) and asked == []  # idle: not read
    assert watch.run_once() == Decision(STAY) and asked == [True]  # busy, but others wait
    assert changes == [] and not watch.pinned
