"""Stateful fuzzing of the API over real sockets: schemathesis chains operations (enqueue, then
read, list, cancel or retry the job it created) against `taskline api` under gunicorn.

Beside test_openapi_schemathesis.py (each operation alone, through WSGI), this run goes through
the server's own reading of requests (taskline_producer.http.intake) with the connection pooling of
a real client. Invariant checked: no 5xx and every answer is one the document declares. The
run is bounded: a fixed number of scenarios and steps, a fixed seed, and the test's timeout.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import hypothesis
import psycopg
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck
from schemathesis.config import SchemathesisConfig

from taskline.store import schema
from taskline_producer.routes.apidoc import document
from tests.conftest import REDIS_URL
from tests.integration.gunicorn_api import Api, running_api
from tests.integration.test_openapi_schemathesis import CHECKS, STREAM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCENARIOS = 40
STEPS = 6


@pytest.fixture(scope="module")
def api(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    # No list cache: a list answered from the previous scenario's state within the cache's
    # second would make a replayed scenario behave otherwise (_from_empty).
    with running_api(template_db, tmp_path_factory.mktemp("fuzz-logs"),
                     TASKLINE_API_LIST_CACHE_S="0") as running:
        yield running


# Every table an answer can reflect: a pause, a limit, a schedule or an audit row left by an
# earlier scenario changes what a later one is answered (GET /api/v1/queues lists a paused
# queue with no jobs, the audit list grows).
EMPTY = "TRUNCATE " + ", ".join(f"taskline.{t.name}" for t in schema.metadata.sorted_tables) + \
    " CASCADE"


def _from_empty(machine: type, api: Api) -> type:
    """The state machine, each scenario starting from an empty server: Hypothesis replays a
    scenario's choices (to check and to shrink a failure) and requires them to behave alike,
    which answers shaped by the jobs earlier scenarios left behind would break."""

    class FromEmpty(machine):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            with psycopg.connect(api.database_url, autocommit=True) as conn:
                conn.execute(EMPTY)
            redis.Redis.from_url(REDIS_URL).flushdb()
            super().setup()

    return FromEmpty


def _replayable(doc: dict) -> dict:
    """`doc` without `unique.period_s` and `wait_s`, whose answers depend on the clock. Whether
    a job created a moment ago is still within a period of microseconds, or a job finished
    within a wait, decides the answer, so a replayed scenario could be answered otherwise,
    which Hypothesis refuses as inconsistent data generation; and with no worker running each
    wait would last its whole `wait_s`. The per-operation run in test_openapi_schemathesis.py
    still sends both; tests/integration/test_waiting.py covers waiting."""
    del doc["components"]["schemas"]["UniqueSpec"]["properties"]["period_s"]
    wait = {"$ref": "#/components/parameters/WaitS"}
    for operations in doc["paths"].values():
        for operation in operations.values():
            if isinstance(operation, dict) and "parameters" in operation:
                operation["parameters"] = [p for p in operation["parameters"] if p != wait]
    del doc["components"]["parameters"]["WaitS"]
    return doc


def test_stateful_sequences_conform_over_http(api: Api) -> None:
    config = SchemathesisConfig.from_dict({
        "seed": 20240501,
        "base-url": api.url(),
        "checks": {**{name: {"enabled": True} for name in CHECKS},
                   "positive_data_acceptance": {"enabled": False},
                   # DELETE cancels a job, which stays readable (status cancelled) by design.
                   "use_after_free": {"enabled": False}},
    })
    # A copy: the state machine adds the links it infers to the document it is given.
    schema = schemathesis.openapi.from_dict(_replayable(copy.deepcopy(document())),
                                            config=config).exclude(path=STREAM)
    machine = _from_empty(schema.as_state_machine(), api)
    machine.run(settings=hypothesis.settings(
        max_examples=SCENARIOS, stateful_step_count=STEPS, deadline=None, database=None,
        derandomize=True, suppress_health_check=list(HealthCheck)))
