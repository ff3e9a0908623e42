"""Every Redis path of taskline again, on a real Redis Cluster (3 masters, 3 replicas).

The tests of the modules below are collected here a second time, with `redis_url` naming one
node of the private cluster (tests.redis_cluster): push, fetch, ack, retry, scheduled, DLQ,
pause, limits, quotas, heartbeats, rebuild, reconcile and processing-list recovery then run
through redis-py's cluster client, chosen by detection alone. Tests that need a private
single Redis (killed, flushed of scripts, counted round trips) stay where they are.
Marked `faults`: the whole matrix runs in `make faults`; `make test` keeps
tests/integration/test_redis_cluster.py (detection, MOVED, waits across slots, registry, and a
stack running jobs on the cluster).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.integration import (
    test_dispatch_scripts,
    test_flow_limits,
    test_maintenance_promoter,
    test_maintenance_reaper,
    test_maintenance_reconciler,
    test_queue_pause,
    test_quotas,
    test_worker_lifecycle,
    test_worker_loop,
    test_worker_outcomes,
)

# As their own modules mark them (handlers' records are reset around each test).
pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.usefixtures("clean_handlers")]

# Fixtures these tests ask for that a single Redis of their own provides.
_SINGLE_ONLY = {"private_redis", "fresh_redis", "private_settings"}
# Tests of what only a single Redis does: its connections (CLIENT LIST of its logical
# database), and a processing list no worker registered found by SCAN (a cluster's lists are
# found through their registry: test_redis_cluster.py).
_SINGLE_CLIENT = {"test_an_idle_worker_picks_up_a_pushed_job_at_once",
                  "test_depths_of_many_queues_equal_each_one_s_depths"}


def _adopt(module: ModuleType) -> None:
    """Collect `module`'s tests and module-level fixtures here, on the cluster."""
    for name, value in vars(module).items():
        if name.startswith("test_") and callable(value):
            if (name not in _SINGLE_CLIENT
                    and _SINGLE_ONLY.isdisjoint(inspect.signature(value).parameters)):
                globals()[name] = value
        elif type(value).__name__ == "FixtureFunctionDefinition" and name != "redis_url":
            globals()[name] = value


for _module in (test_dispatch_scripts, test_flow_limits, test_maintenance_promoter,
                test_maintenance_reaper, test_maintenance_reconciler, test_queue_pause,
                test_quotas, test_worker_lifecycle, test_worker_loop, test_worker_outcomes):
    _adopt(_module)


@pytest.fixture
def redis_url(cluster_redis_url: str) -> Iterator[str]:
    """One node of the cluster, as an operator sets REDIS_URL."""
    yield cluster_redis_url
