"""The worker's scheduling policy (taskline.sched_policy): applied to every thread of the
process and inherited by threads started later; the setting and the option take only the
policies it knows."""

from __future__ import annotations

import os
import threading

import pytest

from taskline import sched_policy
from taskline.errors import ConfigError
from taskline.settings import Settings

linux = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's policies")


@linux
def test_batch_reaches_every_thread_and_those_started_after() -> None:
    started = threading.Event()
    stop = threading.Event()
    early = threading.Thread(target=lambda: (started.set(), stop.wait()), daemon=True)
    early.start()
    started.wait()
    seen: list[str] = []
    before = sched_policy.current()  # the test process's own, restored after
    try:
        assert sched_policy.apply(sched_policy.BATCH)
        assert sched_policy.current(early.native_id or 0) == "batch"
        later = threading.Thread(target=lambda: seen.append(sched_policy.current()))
        later.start()
        later.join()
        assert seen == ["batch"]
        assert sched_policy.current() == "batch"
        assert sched_policy.apply(sched_policy.NORMAL)
        assert sched_policy.current(early.native_id or 0) == "normal"
    finally:
        sched_policy.apply(before if before in sched_policy.POLICIES else sched_policy.NORMAL)
        stop.set()


def test_the_setting_takes_batch_or_normal() -> None:
    assert Settings.from_env(env={}).worker_sched == "batch"
    assert Settings.from_env(env={"TASKLINE_WORKER_SCHED": "normal"}).worker_sched == "normal"
    for wrong in ("fifo", "Batch", "idle"):
        with pytest.raises(ConfigError, match="TASKLINE_WORKER_SCHED must be batch or normal"):
            Settings.from_env(env={"TASKLINE_WORKER_SCHED": wrong})


def test_the_worker_command_takes_a_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from taskline_cli.main import build_parser

    assert build_parser().parse_args(["worker", "--sched", "normal"]).sched == "normal"
    assert build_parser().parse_args(["worker"]).sched is None
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["worker", "--sched", "fifo"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
