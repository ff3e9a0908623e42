"""Every dashboard panel and every alert rule, evaluated by a real Prometheus scraping the real
services.

The test starts Debian's `prometheus` (scraping every second, with deploy/prometheus/alerts.yml
loaded), `prometheus-redis-exporter` and `prometheus-postgres-exporter` against this test's
Redis and PostgreSQL, and `taskline api` (two gunicorn processes, so the multiprocess view is
what is scraped), `worker` and `maintenance`, each on a free loopback port and each stopped by
PID at the end. Two waves of work go through the HTTP API (successes, retries, dead letters,
delayed jobs cancelled), plus the rarer events a panel exists for: a claim conflict, a lease
expired under a running job (a recovery, and a stale completion when its worker finishes
late), and Redis drift for reconciliation to repair.

Then every query of every dashboard panel (`grafana.dashboard.panel_expressions()`) must
parse and return at least one finite sample (a panel that shows "no data" after such a
workload is a broken panel), and every alert expression must parse. The counters of the rare
events are also read back, so the services are seen counting them, not just exporting zeros,
and the depth, live-worker, leader and reconciliation series must come from maintenance alone.
The binaries are required, not optional: .ci/run installs them (apt packages `prometheus`,
`prometheus-redis-exporter`, `prometheus-postgres-exporter`).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from sqlalchemy import text

import taskline
from grafana.dashboard import panel_expressions
from taskline.dispatch.dispatcher import Dispatcher
from taskline.dispatch.keys import QueueKeys
from taskline.settings import Settings
from taskline.store.store import Store
from tests.helpers import service, service_env, stop_process, wait_for
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
BINARIES = {"prometheus": "prometheus", "redis-exporter": "prometheus-redis-exporter",
            "postgres-exporter": "prometheus-postgres-exporter"}
QUEUE = "default"
# Computed by maintenance alone, so Prometheus never adds up copies from other services.
MAINTENANCE_ONLY = ("job_queue_depth", "job_dlq_depth", "job_oldest_ready_age_seconds",
                    "taskline_live_workers", "taskline_maintenance_leader",
                    "reconciliation_duration_seconds_count", "taskline_queue_paused",
                    "taskline_limit_held_jobs")

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Ports:
    api: int
    worker: int
    maintenance: int
    redis_exporter: int
    postgres_exporter: int
    prometheus: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


def binary(name: str) -> str:
    path = shutil.which(BINARIES[name])
    assert path, f"{BINARIES[name]} is missing: .ci/run installs it (apt-get install {name})"
    return path


def prometheus_config(ports: Ports) -> dict:
    """deploy/prometheus/prometheus.yml's jobs and rules, on this test's loopback ports."""
    targets = {"api": ports.api, "worker": ports.worker, "maintenance": ports.maintenance,
               "redis-exporter": ports.redis_exporter,
               "postgres-exporter": ports.postgres_exporter, "prometheus": ports.prometheus}
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": job, "static_configs": [
            {"targets": [f"127.0.0.1:{port}"]}]} for job, port in targets.items()],
    }


@contextmanager
def daemon(args: list[str], log_path: Path, env: dict[str, str] | None = None
           ) -> Iterator[subprocess.Popen]:
    """A non-taskline process, stopped by its PID (SIGTERM, then SIGKILL) on exit."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            yield proc
        finally:
            stop_process(proc)


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def start_observers(stack: ExitStack, settings: Settings, ports: Ports, tmp_path: Path) -> None:
    """The two exporters against this test's servers, and Prometheus scraping everything."""
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(ports)))
    redis = urlsplit(settings.redis_url)
    stack.enter_context(daemon(
        [binary("redis-exporter"), "-redis.addr", f"redis://{redis.netloc}",
         "-web.listen-address", f"127.0.0.1:{ports.redis_exporter}"],
        tmp_path / "redis-exporter.log"))
    stack.enter_context(daemon(
        [binary("postgres-exporter"),
         f"--web.listen-address=127.0.0.1:{ports.postgres_exporter}"],
        tmp_path / "postgres-exporter.log",
        env={"DATA_SOURCE_NAME": settings.database_url + "?sslmode=disable"}))
    stack.enter_context(daemon(
        [binary("prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{ports.prometheus}", "--log.level=warn"],
        tmp_path / "prometheus.log"))


def start_services(stack: ExitStack, settings: Settings, ports: Ports, tmp_path: Path) -> None:
    """`taskline api` (two gunicorn processes), `worker` and `maintenance`."""
    env = service_env(settings)
    stack.enter_context(service(["api", "--bind", f"127.0.0.1:{ports.api}", "--workers", "2"],
                                env, tmp_path))
    stack.enter_context(service(["worker", "--concurrency", "4",
                                 "--metrics-port", str(ports.worker)], env, tmp_path))
    stack.enter_context(service(["maintenance", "--metrics-port", str(ports.maintenance)],
                                env, tmp_path))


@contextmanager
def observed_stack(settings: Settings, tmp_path: Path) -> Iterator[Ports]:
    """Exporters, Prometheus and the three services, all answering; yields their ports."""
    ports = Ports.free()
    with ExitStack() as stack:
        start_observers(stack, settings, ports, tmp_path)
        start_services(stack, settings, ports, tmp_path)
        for port, path in ((ports.prometheus, "/-/ready"), (ports.api, "/healthz"),
                           (ports.worker, "/metrics"), (ports.maintenance, "/metrics"),
                           (ports.redis_exporter, "/metrics"),
                           (ports.postgres_exporter, "/metrics")):
            wait_for(lambda p=port, u=path: answers(f"http://127.0.0.1:{p}{u}"), timeout=20,
                     interval=0.1, message=f"127.0.0.1:{port}{path}")
        yield ports


class Prometheus:
    """Prometheus' HTTP query API."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/api/v1/query"

    def query(self, expr: str) -> dict:
        """The whole answer; a query Prometheus cannot parse answers status "error"."""
        return requests.get(self.url, params={"query": expr}, timeout=10).json()

    def finite(self, expr: str) -> list[float]:
        """The finite values the instant query `expr` returns now."""
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        result = answer["data"]["result"]
        values = [result[1]] if answer["data"]["resultType"] == "scalar" else [
            sample["value"][1] for sample in result]
        return [float(v) for v in values if math.isfinite(float(v))]

    def total(self, expr: str) -> float:
        return sum(self.finite(expr))

    def jobs_exporting(self, metric: str) -> set[str]:
        answer = self.query(f"count by (job) ({metric})")
        return {sample["metric"]["job"] for sample in answer["data"]["result"]}


class Workload:
    """Jobs through the HTTP API, and the rarer events made on purpose."""

    def __init__(self, api_port: int, store: Store, dispatcher: Dispatcher) -> None:
        self.api = f"http://127.0.0.1:{api_port}/api/v1"
        self.store = store
        self.dispatcher = dispatcher

    def post(self, body: dict) -> str:
        response = requests.post(self.api + "/jobs", json=body, timeout=10)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def status(self, job_id: str) -> str:
        return self.store.get_job(uuid.UUID(job_id)).status.value

    def wave(self) -> list[str]:
        """Successes, retries that succeed, a dead letter and a cancelled delayed job; waits
        until every one of them has ended."""
        ids = [self.post({"type": "echo", "payload": {"n": n}}) for n in range(6)]
        ids += [self.post({"type": "simulate", "payload": {"fail_first": 1, "sleep_s": 0.05},
                           "max_retries": 3}) for _ in range(2)]
        ids.append(self.post({"type": "simulate", "max_retries": 3, "payload": {
            "fail_first": 1, "non_retryable": True, "error": "malformed input"}}))
        delayed = self.post({"type": "echo", "delay_s": 300})
        assert requests.delete(f"{self.api}/jobs/{delayed}", timeout=10).status_code == 200
        # A waiting read (wait_s), answered by a slow job's finishing commit.
        slow = self.post({"type": "simulate", "payload": {"sleep_s": 1.0}})
        waited = requests.get(f"{self.api}/jobs/{slow}", params={"wait_s": 10}, timeout=20)
        assert waited.status_code == 200 and waited.json()["status"] == "succeeded", waited.text
        # A unique job asked for twice: the second is folded into the first.
        for expected in (201, 200):
            answer = requests.post(f"{self.api}/jobs", timeout=10, json={
                "type": "echo", "delay_s": 300, "unique": {"key": f"e2e-{slow}"}})
            assert answer.status_code == expected, answer.text
        # Two tagged jobs in one ordering key (the first's end passes the turn), and a delayed
        # one that keeps another key's line open for the ordering gauges.
        ids += [self.post({"type": "echo", "ordering_key": f"e2e-line-{slow}", "tags": ["e2e"]})
                for _ in range(2)]
        self.post({"type": "echo", "delay_s": 300, "ordering_key": f"e2e-open-{slow}"})
        wait_for(lambda: all(self.status(i) in ("succeeded", "dead") for i in ids),
                 timeout=20, message="every job of the wave ended")
        return ids

    def schedule_every_second(self) -> None:
        """A schedule whose slots fire every second (a seconds field last), for the schedule
        panels; a bulk requeue of the wave's dead job for the bulk DLQ panel."""
        response = requests.put(self.api + "/schedules/e2e", timeout=10, json={
            "cron": "* * * * * *", "job": {"type": "echo", "queue": QUEUE}})
        assert response.status_code == 201, response.text

    def bulk_retry(self) -> None:
        response = requests.post(self.api + "/dlq/retry", json={"type": "simulate"}, timeout=10)
        assert response.status_code == 200 and response.json()["requeued"] >= 1, response.text

    def claim_conflict(self, done_id: str) -> None:
        """Push the id of a finished job again: the worker fetches it and loses the claim."""
        self.dispatcher.push([(QUEUE, 5, done_id)])

    def drift(self) -> None:
        """Redis out of step with PostgreSQL: a delayed job missing from its set, and an id no
        job has in that set; reconciliation restores the one and removes the other."""
        missing = self.post({"type": "echo", "delay_s": 300})
        self.dispatcher.unschedule(QUEUE, missing)
        self.dispatcher.schedule_many(QUEUE, [(str(uuid.uuid4()), 2**41)])

    def enqueue_in_transaction(self) -> None:
        """A job enqueued inside an application's transaction: the outbox relay pushes it."""
        with self.store.transaction() as conn:
            taskline.enqueue(conn, "echo", {"from": "an application transaction"})

    def limit(self) -> None:
        """A flow limit with both budgets, on a type nothing enqueues: its gauges exist."""
        response = requests.put(f"{self.api}/limits/type:e2e.limited", timeout=10,
                                json={"concurrency": 1, "rate": {"limit": 10, "period_s": 1}})
        assert response.status_code == 201, response.text

    def hold_by_pause(self) -> bool:
        """Pause the queue in PostgreSQL alone (as if Redis lost the marker) and enqueue: the
        worker fetches the job, the claim refuses it, and the worker hands it back. The queue
        stays paused (the paused-queue panel has data); returns whether a hold was counted."""
        self.store.pause_queue(QUEUE, "e2e")
        self.dispatcher.client.delete(QueueKeys(QUEUE).paused)
        self.post({"type": "echo"})
        return False

    def lose_a_lease(self) -> str:
        """Expire the lease of a running job until the reaper recovers it; its worker then
        finds the lease gone and its outcome is rejected as stale."""
        job_id = self.post({"type": "simulate", "payload": {"sleep_s": 3}, "max_retries": 3})
        wait_for(lambda: self.status(job_id) == "running", message="the slow job running")
        wait_for(lambda: self._expire(job_id) or self._recovered(job_id), timeout=15,
                 interval=0.2, message="the job recovered by the reaper")
        return job_id

    def _expire(self, job_id: str) -> bool:
        with self.store.transaction() as conn:
            conn.execute(text("UPDATE taskline.job_leases SET leased_until = now() - interval "
                              "'1 second' "
                              "WHERE job_id = :id AND released_at IS NULL"), {"id": job_id})
        return False

    def _recovered(self, job_id: str) -> bool:
        events, _ = self.store.get_history(uuid.UUID(job_id))
        return any(e["event"] == "recovered" for e in events)


def alert_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def panels_without_data(prometheus: Prometheus, timeout: float) -> list[str]:
    """The panel queries still without a finite sample once `timeout` seconds have passed (the
    last scrapes may be a second behind); every query must parse meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        blank = [f"{title}: {expr}" for title, expr in panel_expressions()
                 if not prometheus.finite(expr)]
        if not blank or time.monotonic() > deadline:
            return blank
        time.sleep(0.5)


def test_every_panel_shows_data_and_every_alert_parses(settings: Settings, store: Store,
                                                       dispatcher: Dispatcher, tmp_path: Path):
    with observed_stack(settings, tmp_path) as ports:
        prometheus = Prometheus(ports.prometheus)
        work = Workload(ports.api, store, dispatcher)
        work.drift()
        work.enqueue_in_transaction()
        work.limit()
        work.schedule_every_second()
        first = work.wave()
        work.lose_a_lease()
        # The second wave must land in later scrapes than the first, so rates see increases.
        wait_for(lambda: prometheus.total("sum(job_completed_total)") >= 8, timeout=15,
                 message="the first wave scraped")
        work.claim_conflict(first[0])
        work.bulk_retry()
        work.wave()
        wait_for(lambda: work.hold_by_pause() or prometheus.total(
            "sum(taskline_queue_pause_held_total)") >= 1, timeout=20, interval=1.0,
            message="an id held back by a pause, counted and scraped")
        rare = ("job_claim_conflicts_total", "job_recovered_total", "job_stale_completions_total",
                "reconciliation_missing_jobs_total", "reconciliation_corrupted_metadata_total")
        for name in rare:
            wait_for(lambda n=name: prometheus.total(f"sum({n})") >= 1, timeout=20,
                     interval=0.25, message=f"{name} counted and scraped")
        missing = panels_without_data(prometheus, timeout=20)
        assert missing == [], missing
        assert prometheus.total('sum(taskline_http_request_duration_seconds_count'
                                '{route="/api/v1/jobs", method="POST", status="201"})') >= 20
        for name in MAINTENANCE_ONLY:
            assert prometheus.jobs_exporting(name) == {"maintenance"}, name
        for name, expr in alert_expressions():
            answer = prometheus.query(expr)
            assert answer["status"] == "success", (name, answer)
    # Scrapes went on while the api stopped: none of them may have hit a half-torn-down api.
    (api_log,) = tmp_path.glob("api-*.log")
    assert '"unhandled error"' not in api_log.read_text()


def test_a_metrics_file_caught_while_being_created_does_not_fail_the_scrape(
        settings: Settings, tmp_path: Path):
    # A gunicorn process creates its file before sizing it; killed in between, it leaves an
    # empty file that prometheus-client alone would fail every later scrape on.
    folder = tmp_path / "multiproc"
    port = free_port()
    env = service_env(settings, PROMETHEUS_MULTIPROC_DIR=str(folder))
    with service(["api", "--bind", f"127.0.0.1:{port}", "--workers", "2"], env, tmp_path):
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(url + "/healthz"), timeout=20, message="the api")
        (folder / "counter_999999.db").touch()
        for _ in range(4):  # both gunicorn processes answer some of them
            response = requests.get(url + "/metrics", timeout=10)
            assert response.status_code == 200
            assert 'taskline_http_requests_total{method="GET",route="/healthz"' in response.text
