"""Redis key names: one hash tag per queue, strict priority order, queue-name validation."""

from __future__ import annotations

import pytest

from taskline.dispatch.keys import (
    QueueKeys,
    partition_of,
    partition_of_key,
    split_partition,
    valid_queue_name,
    worker_key,
)


def test_every_queue_key_carries_the_queue_hash_tag():
    keys = QueueKeys("emails")
    all_keys = [*keys.ready_by_urgency, keys.processing("w1"), keys.retry, keys.scheduled,
                keys.dlq, keys.signal, keys.snapshot("seen")]
    assert all("{emails}" in k for k in all_keys)
    assert len(set(all_keys)) == len(all_keys)


def test_ready_lists_are_ordered_most_urgent_first():
    assert QueueKeys("q").ready_by_urgency[0].endswith(":ready:9")
    assert QueueKeys("q").ready_by_urgency[-1].endswith(":ready:0")


def test_worker_of_processing_key():
    keys = QueueKeys("q")
    assert keys.worker_of(keys.processing("host-1-abc")) == "host-1-abc"
    assert worker_key("w") == "taskline:worker:w"


@pytest.mark.parametrize("name", ["", "a{b}", "x" * 65, "sp ace", "new\nline", None, 5])
def test_invalid_queue_names_are_rejected(name):
    assert not valid_queue_name(name)
    with pytest.raises(ValueError):
        QueueKeys(name)


def test_partition_zero_keeps_the_plain_keys_and_others_carry_their_own_tag():
    assert QueueKeys("emails", 0) == QueueKeys("emails")
    assert QueueKeys("emails", 0).ready(5) == "taskline:{emails}:ready:5"
    assert QueueKeys("emails", 2).ready(5) == "taskline:{emails#2}:ready:5"
    assert QueueKeys("emails", 2).name == "emails#2"
    assert split_partition("emails#2") == ("emails", 2)
    assert split_partition("emails") == ("emails", 0)
    assert partition_of_key(QueueKeys("emails", 3).processing("w1")) == 3
    assert partition_of_key(QueueKeys("emails").processing("w1")) == 0
    assert not valid_queue_name("emails#2")  # no queue name can be taken for a partition's


def test_an_id_has_one_stable_home_among_the_partitions():
    ids = [f"00000000-0000-0000-0000-{i:012d}" for i in range(300)]
    homes = [partition_of(i, 4) for i in ids]
    assert homes == [partition_of(i, 4) for i in ids]
    assert set(homes) == {0, 1, 2, 3}
    assert {partition_of(i, 1) for i in ids} == {0}
