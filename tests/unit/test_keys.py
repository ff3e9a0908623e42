"""Redis key names: one hash tag per queue, strict priority order, queue-name validation."""

from __future__ import annotations

import pytest

from taskline.dispatch.keys import QueueKeys, valid_queue_name, worker_key


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
