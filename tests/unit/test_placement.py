"""Where an `auto`-pinned worker belongs (taskline.placement): moved off a CPU other processes
crowd while another idles, unpinned when its own threads keep its CPU busy, left alone on a
loaded host; and the real moves, in a child process, reach every thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from taskline import placement
from taskline.placement import MOVE, STAY, UNPIN, Decision, Sample, decide

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


def test_a_process_that_keeps_its_cpu_busy_is_unpinned() -> None:
    before, after = window(0.95, {0: 0.0, 1: 0.9})
    assert decide(before, after, 0, {0, 1}, coin=0.9) == Decision(UNPIN)


def test_an_idle_cpu_stays() -> None:
    before, after = window(0.01, {0: 0.95, 1: 0.97})
    assert decide(before, after, 0, {0, 1}, coin=0.0) == Decision(STAY)


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
    os.sched_setaffinity(0, {first})
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for thread in threads:
        thread.start()

    def placed():
        return sorted({tuple(sorted(os.sched_getaffinity(t))) for t in affinity.threads()})

    samples = iter([
        Sample(0.0, 0.0, {first: (0, 0), last: (0, 0)}),
        Sample(1.0, 0.3, {first: (2, 100), last: (90, 100)}),  # crowded: to `last`
        Sample(2.0, 0.3, {first: (2, 100), last: (90, 100)}),  # a new CPU's first look
        Sample(3.0, 1.3, {first: (2, 200), last: (90, 200)}),  # its own threads: a whole CPU
    ])
    changes = []
    watch = Placement(first, allowed, changes.append, sample=lambda: next(samples),
                      coin=lambda: 0.0)
    looks = []
    for _ in range(4):
        looks.append([watch.run_once().action, placed()])
    stop.set()
    print(json.dumps({"looks": looks, "changes": changes, "allowed": sorted(allowed),
                      "first": first, "last": last}))
""")



def test_a_move_and_an_unpin_reach_every_thread(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=env, check=True, timeout=30)
    result = json.loads(out.stdout)
    if len(result["allowed"]) < 2:
        pytest.skip("needs two CPUs")
    first, last, allowed = [result["first"]], [result["last"]], result["allowed"]
    assert result["looks"] == [["stay", [first]], ["move", [last]], ["stay", [last]],
                               ["unpin", [allowed]]]  # every thread, each time
    assert result["changes"] == [last, None]
