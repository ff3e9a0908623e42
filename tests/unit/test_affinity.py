"""CPU lists and `auto`'s slots (taskline.affinity): distinct CPUs while they last, a slot freed
with its holder, and lists checked before anything is pinned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taskline import affinity
from taskline.errors import ConfigError
from taskline.settings import Settings


@pytest.mark.parametrize("spec", ["", "auto", "none", "0", "3", "0,2", "0-3", "0-3,6,8-9"])
def test_valid_lists(spec: str) -> None:
    assert affinity.valid(spec)


@pytest.mark.parametrize("spec", ["Auto", "None", "off", "x", "1,", ",1", "3-1", "-1", "0-",
                                  "1 2", "0;2"])
def test_invalid_lists(spec: str) -> None:
    assert not affinity.valid(spec)
    with pytest.raises(ConfigError, match="TASKLINE_WORKER_CPUS"):
        Settings.from_env(env={"TASKLINE_WORKER_CPUS": spec})


def test_a_list_names_its_cpus() -> None:
    assert affinity.parse("0-3,6,8-9") == {0, 1, 2, 3, 6, 8, 9}
    assert affinity.parse("5") == {5}


def test_slots_give_every_cpu_once_then_none(tmp_path: Path) -> None:
    slots = [affinity.claim_slot([0, 1, 2], tmp_path) for _ in range(3)]
    try:
        assert sorted(slot[0] for slot in slots if slot) == [0, 1, 2]
        assert affinity.claim_slot([0, 1, 2], tmp_path) is None
    finally:
        for slot in slots:
            if slot:
                os.close(slot[1])


def test_a_slot_is_free_again_once_its_holder_lets_go(tmp_path: Path) -> None:
    held = affinity.claim_slot([4], tmp_path)
    assert held is not None and held[0] == 4
    assert affinity.claim_slot([4], tmp_path) is None
    os.close(held[1])
    reclaimed = affinity.claim_slot([4], tmp_path)
    assert reclaimed is not None
    assert (tmp_path / "cpu4-0.lock").exists()  # the name earlier releases lock too
    os.close(reclaimed[1])


def test_auto_assigns_a_cpu_without_pinning(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    cpu = affinity.assign(slots_dir=tmp_path)
    try:
        assert cpu in before
        assert os.sched_getaffinity(0) == before
        assert affinity.pin("auto") is None
    finally:
        affinity.release_slots()


def test_pin_refuses_cpus_the_process_may_not_use_and_changes_nothing() -> None:
    before = os.sched_getaffinity(0)
    outside = max(before) + 1
    with pytest.raises(ConfigError, match=f"CPUs {outside} are not among"):
        affinity.pin(str(outside))
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("spec", ["", "none"])
def test_no_spec_or_none_pins_nothing(spec: str) -> None:
    before = os.sched_getaffinity(0)
    assert affinity.pin(spec) is None
    assert os.sched_getaffinity(0) == before


def test_workers_are_pinned_by_default() -> None:
    assert Settings.from_env(env={}).worker_cpus == affinity.AUTO
    assert Settings.from_env(env={"TASKLINE_WORKER_CPUS": "none"}).worker_cpus == "none"


def test_the_worker_command_takes_a_list_auto_or_none(capsys: pytest.CaptureFixture[str]) -> None:
    from taskline_cli.main import build_parser

    assert build_parser().parse_args(["worker", "--cpus", "0-1"]).cpus == "0-1"
    assert build_parser().parse_args(["worker", "--cpus", "none"]).cpus == "none"
    assert build_parser().parse_args(["worker"]).cpus is None
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["worker", "--cpus", "fast"])
    assert exit_.value.code == 2
    assert "auto, none or a CPU list" in capsys.readouterr().err


def test_a_process_left_without_a_cpu_makes_the_host_oversubscribed(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    slots = [affinity.claim_slot(cpus, tmp_path) for _ in cpus]  # other processes' CPUs
    try:
        assert not affinity.oversubscribed(slots_dir=tmp_path)
        assert affinity.assign(slots_dir=tmp_path) is None
        # The spare it now holds (flock: each open file is locked on its own, so a look from
        # this process finds it taken as another process's would).
        assert affinity.oversubscribed(slots_dir=tmp_path)
        affinity.release_slots()
        assert not affinity.oversubscribed(slots_dir=tmp_path)
    finally:
        for slot in slots:
            if slot:
                os.close(slot[1])
