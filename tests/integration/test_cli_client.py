"""The `taskline` client commands as a user runs them, against a real `taskline api` subprocess.

Each command is a fresh `python -m taskline_cli.main` process; the tests check its exit code
(0 ok, 1 API error, 2 usage), its stdout (tables, or JSON with --json) and its stderr. The tests
share one database and one API (tests/integration/conftest.py), so each names its queues apart
or picks out its own rows; the one that needs a worker gets a database and an API of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.store import Store
from tests.conftest import short_settings
from tests.helpers import service, service_env, start_api
from tests.integration.test_client_api import WORKER, make_dead


@pytest.fixture
def settings(module_settings: Settings, redis_url: str) -> Settings:
    return module_settings


@pytest.fixture
def api_url(module_api_url: str, redis_url: str) -> str:
    return module_api_url


def command_line(*args: str, url: str | None = None,
                 **env: str) -> tuple[list[str], dict[str, str]]:
    """The `taskline` process to run for `args` and its environment, without TASKLINE_*."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLINE_")}
    full_env.update(env)
    command = [sys.executable, "-m", "taskline_cli.main", *args]
    if url:
        command += ["--url", url]
    return command, full_env


def taskline(*args: str, url: str | None = None, stdin: str | None = None,
             **env: str) -> subprocess.CompletedProcess[str]:
    command, full_env = command_line(*args, url=url, **env)
    return subprocess.run(command, env=full_env, input=stdin, capture_output=True, text=True,
                          timeout=60)


def test_enqueue_then_status(api_url: str) -> None:
    done = taskline("enqueue", "echo", "--payload", '{"to": "ada"}', "--queue", "mail",
                    "--priority", "high", "--max-retries", "2", "--timeout", "5", "--json",
                    url=api_url)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert (job["queue"], job["priority"], job["max_retries"], job["payload"]) == (
        "mail", 7, 2, {"to": "ada"})
    shown = taskline("status", job["id"], url=api_url)
    assert shown.returncode == 0, shown.stderr
    fields, _, events = shown.stdout.partition("\n\n")
    values = dict(line.split(None, 1) for line in fields.splitlines())
    assert (values["id"], values["status"], values["payload"]) == (
        job["id"], "queued", '{"to":"ada"}')
    assert events.splitlines()[0].split() == ["AT", "ATTEMPT", "EVENT", "WORKER", "ACTOR",
                                              "DETAIL"]
    assert events.splitlines()[1].split()[1:3] == ["0", "enqueued"]
    as_json = json.loads(taskline("status", job["id"], "--json", url=api_url).stdout)
    assert as_json["id"] == job["id"] and as_json["events"][0]["event"] == "enqueued"


def test_enqueue_prints_id_and_status(api_url: str) -> None:
    done = taskline("enqueue", "echo", "--delay", "60", url=api_url)
    assert done.returncode == 0, done.stderr
    job_id, status = done.stdout.split()
    assert uuid.UUID(job_id) and status == "scheduled"


def test_url_and_token_come_from_the_environment(api_url: str) -> None:
    done = taskline("enqueue", "echo", "--payload", "[1, 2]", TASKLINE_URL=api_url,
                    TASKLINE_TOKEN="unused-without-auth")
    assert done.returncode == 0, done.stderr


def test_payload_from_a_file_and_stdin(api_url: str, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"from": "file"}')
    from_file = taskline("enqueue", "echo", "--payload", f"@{path}", "--json", url=api_url)
    assert json.loads(from_file.stdout)["payload"] == {"from": "file"}
    from_stdin = taskline("enqueue", "echo", "--payload", "-", "--json", url=api_url,
                          stdin='{"from": "stdin"}')
    assert json.loads(from_stdin.stdout)["payload"] == {"from": "stdin"}


def test_same_idempotency_key_gives_the_same_job(api_url: str) -> None:
    runs = [taskline("enqueue", "echo", "--idempotency-key", "k-1", "--json", url=api_url)
            for _ in range(2)]
    assert len({json.loads(r.stdout)["id"] for r in runs}) == 1


def test_usage_errors_exit_2(api_url: str) -> None:
    bad_json = taskline("enqueue", "echo", "--payload", "{nope", url=api_url)
    assert bad_json.returncode == 2 and "--payload is not valid JSON" in bad_json.stderr
    missing = taskline("enqueue", "echo", "--payload", "@/nonexistent/x.json", url=api_url)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    argparse_error = taskline("enqueue", url=api_url)
    assert argparse_error.returncode == 2
    both = taskline("enqueue", "echo", "--delay", "1", "--run-at", "2030-01-01T00:00:00Z",
                    url=api_url)
    assert both.returncode == 2
    for command in (("status", "01a2358d"), ("cancel", "nonsense"), ("dlq", "retry", "x"),
                    ("dlq", "purge", "--id", "x"), ("workflow", "status", "01a2358d")):
        not_an_id = taskline(*command, url=api_url)
        assert not_an_id.returncode == 2 and "is not an id: ids are UUIDs" in not_an_id.stderr


def test_a_reader_that_stops_early_ends_the_command_quietly(api_url: str,
                                                            tmp_path: Path) -> None:
    """`taskline status ID --json | head -1`: more output than a pipe holds, and the reader
    gone after one line, ends the command with SIGPIPE's status and no traceback."""
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"blob": "x" * 300_000}))
    job = json.loads(taskline("enqueue", "echo", "--payload", f"@{payload}", "--json",
                              url=api_url).stdout)
    command, env = command_line("status", job["id"], "--json", url=api_url)
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().startswith("{")
        proc.stdout.close()
        stderr = proc.stderr.read() if proc.stderr else ""
        assert proc.wait(timeout=60) == 141
    assert stderr == ""


def test_api_errors_exit_1_with_the_message_on_stderr(api_url: str) -> None:
    unknown = taskline("status", str(uuid.uuid4()), url=api_url)
    assert unknown.returncode == 1
    assert "404 not_found" in unknown.stderr and unknown.stdout == ""
    invalid = taskline("enqueue", "echo", "--priority", "12", url=api_url)
    assert invalid.returncode == 1
    assert "422 validation_failed" in invalid.stderr and '"field": "priority"' in invalid.stderr


def test_unreachable_api_exits_1() -> None:
    done = taskline("queues", "--http-timeout", "1", url="http://127.0.0.1:9")
    assert done.returncode == 1 and "unreachable" in done.stderr


def test_dlq_list_and_retry(api_url: str, store: Store, dispatcher: Dispatcher) -> None:
    dead_id = make_dead(store, dispatcher, queue="billing")
    listing = taskline("dlq", "list", "--queue", "billing", url=api_url)
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()
    assert header.split()[:3] == ["ID", "TYPE", "QUEUE"]
    assert row.split()[:4] == [dead_id, "simulate", "billing", "1"]
    assert "simulated failure" in row
    retried = taskline("dlq", "retry", dead_id, url=api_url)
    assert retried.returncode == 0 and retried.stdout.split() == [dead_id, "queued"]
    assert taskline("dlq", "list", url=api_url).stdout.strip() == "(none)"
    again = taskline("dlq", "retry", dead_id, url=api_url)
    assert again.returncode == 1 and "409" in again.stderr


def test_cancel(api_url: str) -> None:
    job = json.loads(taskline("enqueue", "echo", "--json", url=api_url).stdout)
    done = taskline("cancel", job["id"], url=api_url)
    assert done.returncode == 0 and done.stdout.split() == [job["id"], "cancelled"]


def test_workers_and_queues_tables(api_url: str, store: Store) -> None:
    taskline("enqueue", "echo", "--queue", "reports", url=api_url)
    store.upsert_worker(WORKER, "host-a", 4242, ["reports", "mail"], 3, metrics_port=9107)
    workers = taskline("workers", url=api_url)
    assert workers.returncode == 0, workers.stderr
    header, row = workers.stdout.splitlines()
    assert header.split()[:4] == ["ID", "HOST", "PID", "QUEUES"]
    assert row.split()[:5] == [WORKER, "host-a", "4242", "reports,mail", "3"]
    assert "METRICS PORT" in header and "9107" in row.split()
    queues = taskline("queues", url=api_url)
    assert queues.returncode == 0, queues.stderr
    rows = [line.split() for line in queues.stdout.splitlines()]
    assert rows[0][:4] == ["QUEUE", "PAUSED", "SCHEDULED", "QUEUED"]
    assert next(r for r in rows if r[0] == "reports")[:4] == ["reports", "False", "0", "1"]
    # No maintenance instance has rebuilt this Redis: the mode says so.
    assert rows[-1][:2] == ["dispatch:", "rebuilding"]
    as_json = json.loads(taskline("queues", "--json", url=api_url).stdout)
    assert "reports" in {q["name"] for q in as_json["queues"]}


def test_pause_and_resume_a_queue(api_url: str, store: Store) -> None:
    paused = taskline("pause", "reports", "--json", url=api_url)
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"] is True
    assert set(store.paused_queues()) == {"reports"}
    resumed = taskline("resume", "reports", url=api_url)
    assert (resumed.returncode, resumed.stdout.strip()) == (0, "reports resumed")
    assert store.paused_queues() == {}
    refused = taskline("pause", "no spaces", url=api_url)
    assert refused.returncode != 0 and "queue must be" in refused.stderr


def test_limits_set_list_delete(api_url: str, store: Store) -> None:
    done = taskline("limits", "set", "type:mail", "--concurrency", "3", "--rate", "100/1",
                    "--per-key", url=api_url)
    assert (done.returncode, done.stdout.strip()) == (
        0, "type:mail  concurrency 3, rate 100/1s, per key")
    listed = taskline("limits", "list", url=api_url)
    header, row = listed.stdout.splitlines()
    assert header.split() == ["SCOPE", "LIMITS", "RUNNING", "STARTED", "HELD"]
    assert row.split()[0] == "type:mail"
    refused = taskline("limits", "set", "type:mail", "--rate", "many", url=api_url)
    assert refused.returncode == 2 and "--rate takes N/SECONDS" in refused.stderr
    invalid = taskline("limits", "set", "tenant:x", "--concurrency", "1", url=api_url)
    assert invalid.returncode == 1 and "unknown scope kind" in invalid.stderr
    removed = taskline("limits", "delete", "type:mail", url=api_url)
    assert removed.returncode == 0 and "0 held jobs released" in removed.stdout
    assert store.list_flow_limits() == []


@pytest.fixture
def own_api_url(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """A database and an API of the test's own, and a worker over them: the worker registers
    itself and dead-letters a job, which the module's workers and dlq listings must not see."""
    own = short_settings(database_url, redis_url)
    with service(["worker", "--queues", "default", "--concurrency", "2"],
                 service_env(own), tmp_path / "logs") as proc:
        yield from start_api(own, tmp_path / "logs")
        assert proc.poll() is None, f"taskline worker exited; see {tmp_path / 'logs'}"


def test_enqueue_wait_reports_how_the_job_ended(own_api_url: str) -> None:
    api_url = own_api_url
    ok = taskline("enqueue", "echo", "--payload", '{"n": 1}', "--wait", "--wait-timeout", "20",
                  url=api_url)
    assert ok.returncode == 0, ok.stderr
    values = dict(line.split(None, 1) for line in ok.stdout.splitlines())
    assert (values["status"], values["result"]) == ("succeeded", '{"n":1}')
    failed = taskline("enqueue", "simulate", "--payload", '{"fail_first": 9}', "--max-retries",
                      "0", "--wait", "--wait-timeout", "20", "--json", url=api_url)
    assert failed.returncode == 1
    job = json.loads(failed.stdout)
    assert job["status"] == "dead" and "simulated failure" in job["last_error"]


def test_audit_and_whoami(api_url: str) -> None:
    job = json.loads(taskline("enqueue", "echo", "--json", url=api_url).stdout)
    assert taskline("cancel", job["id"], url=api_url).returncode == 0
    listing = taskline("audit", "--action", "job.cancel", url=api_url)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["AT", "ACTOR", "ACTION", "TARGET", "DETAIL"]
    # Other tests in the module cancel jobs too: this job's cancel is one record of them.
    [row] = [r for r in rows if job["id"] in r.split()]
    assert row.split()[1:4] == ["-", "job.cancel", job["id"]]
    who = taskline("whoami", url=api_url)
    assert who.stdout.split() == ["(anonymous)", "anonymous", "jobs:operate", "jobs:read",
                                  "jobs:write"]
