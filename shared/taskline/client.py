"""Python client of the taskline HTTP API (v1).

Invariant: a retried request can never create a second job. Every enqueue carries an
idempotency key (a fresh uuid4 when the caller names none), so when an answer is lost or the API
says 503 and the client sends the same request again, the API returns the job the first try
created. 503 answers are retried after their Retry-After, a bounded number of times; a request
that never reached the API (connection refused, connect timeout) is retried too, and one whose
connection broke mid-way only when replaying it is harmless. Any other failure is raised as
`ClientError` carrying the API's error shape `{"error": {"code", "message", "details"}}`.

    client = Client("http://127.0.0.1:8000", token="...")
    job = client.enqueue("webhook", {"url": "https://example.com/hook"}, priority="high")
    done = client.wait(job["id"], timeout=30)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import requests
import tenacity
from urllib3.exceptions import ConnectTimeoutError

from taskline.jobs import TERMINAL

API_PREFIX = "/api/v1"
TERMINAL_STATUSES = frozenset(status.value for status in TERMINAL)


class ClientError(Exception):
    """The API refused the request, or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.retry_after_s = retry_after_s

    @classmethod
    def from_response(cls, response: requests.Response) -> ClientError:
        """Read the API's error shape; anything else (a proxy's HTML page) is summarised."""
        try:
            error = response.json()["error"]
            code, message = str(error["code"]), str(error["message"])
            details = error.get("details")
        except (ValueError, KeyError, TypeError):
            code, message, details = f"http_{response.status_code}", response.text[:200], None
        return cls(response.status_code, code, message, details,
                   _retry_after(response.headers.get("Retry-After")))


def _retry_after(value: str | None) -> float | None:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


class Client:
    """A small, thread-compatible client: one `requests.Session` per Client."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, *,
                 attempts: int = 4, max_wait_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """`attempts` bounds the tries of one request (503 / unreachable); `max_wait_s` caps
        the wait between tries, whatever Retry-After asks."""
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        self._session = requests.Session()
        self._session.headers["Accept"] = "application/json"
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    # -- jobs -------------------------------------------------------------------------------

    def enqueue(self, type: str, payload: Any = None, *, queue: str | None = None,
                priority: int | str | None = None, max_retries: int | None = None,
                timeout_s: float | None = None, delay_s: float | None = None,
                run_at: datetime | str | None = None,
                idempotency_key: str | None = None,
                limit_key: str | None = None) -> dict[str, Any]:
        """Enqueue one job and return it (status 201 new, 200 when the key was seen before)."""
        spec = job_spec(type, payload, queue=queue, priority=priority, max_retries=max_retries,
                        timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                        idempotency_key=idempotency_key, limit_key=limit_key)
        return self._call("POST", "/jobs", body=spec)

    def enqueue_batch(self, specs: Iterable[Mapping[str, Any]]) -> Any:
        """Enqueue up to 1,000 jobs in one transaction; each spec takes `enqueue`'s fields."""
        jobs = [job_spec(**dict(spec)) for spec in specs]
        return self._call("POST", "/jobs/batch", body={"jobs": jobs})

    def get(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """The job with its attempts, lease, last error, result and event history."""
        return self._call("GET", f"/jobs/{_segment(job_id)}")

    def list(self, status: str | None = None, type: str | None = None,
             queue: str | None = None, limit: int | None = None,
             cursor: str | None = None) -> dict[str, Any]:
        """One page of jobs matching the filters; pass the page's cursor to get the next."""
        params = {"status": status, "type": type, "queue": queue, "limit": limit,
                  "cursor": cursor}
        return self._call("GET", "/jobs", params=params)

    def cancel(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """Cancel a pending job, or ask a running one to stop."""
        return self._call("DELETE", f"/jobs/{_segment(job_id)}")

    def retry(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """Requeue a dead-lettered job."""
        # A lost answer replayed would meet a job that is already queued: not retried blindly.
        return self._call("POST", f"/jobs/{_segment(job_id)}/retry", replay_safe=False)

    def dlq(self, queue: str | None = None, limit: int | None = None,
            cursor: str | None = None) -> dict[str, Any]:
        """Dead-lettered jobs with their final error and attempts."""
        return self._call("GET", "/dlq", params={"queue": queue, "limit": limit,
                                                 "cursor": cursor})

    def workers(self) -> dict[str, Any]:
        """The live worker registry: heartbeats and active jobs."""
        return self._call("GET", "/workers")

    def queues(self) -> dict[str, Any]:
        """Depth per queue, priority and state."""
        return self._call("GET", "/queues")

    def audit(self, actor: str | None = None, action: str | None = None,
              limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of the audit trail (needs jobs:operate), newest first."""
        return self._call("GET", "/audit", params={"actor": actor, "action": action,
                                                   "limit": limit, "cursor": cursor})

    def whoami(self) -> dict[str, Any]:
        """The name and scopes of the token this client sends."""
        return self._call("GET", "/whoami")

    def pause_queue(self, queue: str) -> dict[str, Any]:
        """Pause a queue (needs jobs:operate): within 1 s no worker starts a new job of it."""
        return self._call("POST", f"/queues/{_segment(queue)}/pause")

    def resume_queue(self, queue: str) -> dict[str, Any]:
        """Resume a paused queue (needs jobs:operate)."""
        return self._call("POST", f"/queues/{_segment(queue)}/resume")

    def set_limit(self, scope: str, *, concurrency: int | None = None,
                  rate: int | None = None, period_s: float | None = None,
                  per_key: bool = False) -> dict[str, Any]:
        """Create or replace the flow limits of `scope` (`type:<type>` or `queue:<queue>`):
        `concurrency` running at once and/or `rate` starts per `period_s`, cluster-wide."""
        body: dict[str, Any] = {"per_key": per_key}
        if concurrency is not None:
            body["concurrency"] = concurrency
        if rate is not None or period_s is not None:
            body["rate"] = {"limit": rate, "period_s": period_s}
        return self._call("PUT", f"/limits/{_segment(scope)}", body=body)

    def limits(self) -> dict[str, Any]:
        """Every flow limit with its use now (running, started in the window, held jobs)."""
        return self._call("GET", "/limits")

    def delete_limit(self, scope: str) -> dict[str, Any]:
        """Remove the flow limits of `scope`; the jobs it held go back to Redis."""
        return self._call("DELETE", f"/limits/{_segment(scope)}", replay_safe=False)

    def wait(self, job_id: str | uuid.UUID, timeout: float = 60.0,
             poll: float = 0.2) -> dict[str, Any]:
        """Poll until the job is succeeded, dead or cancelled; TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.get("status") in TERMINAL_STATUSES:
                return job
            if time.monotonic() + poll > deadline:
                raise TimeoutError(f"job {job_id} is still {job.get('status')} after {timeout}s")
            self._sleep(poll)

    # -- transport ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, body: Any = None,
              params: Mapping[str, Any] | None = None, replay_safe: bool = True) -> Any:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=tenacity.retry_if_exception(lambda err: _worth_retrying(err, replay_safe)),
            sleep=self._sleep,
            reraise=True,
        )
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return retrying(self._send, method, path, body, query)

    def _send(self, method: str, path: str, body: Any, query: dict[str, Any]) -> Any:
        try:
            response = self._session.request(
                method, self.base_url + API_PREFIX + path, params=query or None,
                json=body, timeout=self.timeout)
        except requests.ConnectionError as err:
            if _never_sent(err):
                raise ClientError(0, "unreachable",
                                  f"cannot reach {self.base_url}: {_cause(err)}") from None
            raise ClientError(0, "connection_lost", f"{method} {path}: {_cause(err)}") from None
        except requests.Timeout as err:
            raise ClientError(0, "timeout", f"{method} {path}: {_cause(err)}") from None
        except requests.RequestException as err:
            raise ClientError(0, "request_failed", str(err)) from None
        if not response.ok:
            raise ClientError.from_response(response)
        if response.status_code == 204 or not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise ClientError(response.status_code, "invalid_response",
                              "the API answered with something other than JSON") from None

    def _wait(self, state: tenacity.RetryCallState) -> float:
        err = state.outcome.exception() if state.outcome else None
        if isinstance(err, ClientError) and err.retry_after_s is not None:
            return min(err.retry_after_s, self.max_wait_s)
        return min(0.2 * 2 ** (state.attempt_number - 1), self.max_wait_s)

    # -- schedules and bulk dead-letter operations ---------------------------------------------

    def set_schedule(self, name: str, cron: str, job: Mapping[str, Any], *,
                     timezone: str | None = None, paused: bool | None = None,
                     catch_up: str | None = None) -> dict[str, Any]:
        """Create or replace schedule `name` (`job` as `enqueue` takes it, without delay_s,
        run_at or idempotency_key); the schedule with its next five runs."""
        body = {"cron": cron, "job": dict(job), "timezone": timezone, "paused": paused,
                "catch_up": catch_up}
        return self._call("PUT", f"/schedules/{_segment(name)}",
                          body={k: v for k, v in body.items() if v is not None})

    def schedule(self, name: str) -> dict[str, Any]:
        """One schedule with its next runs, last slot and last job."""
        return self._call("GET", f"/schedules/{_segment(name)}")

    def schedules(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of schedules, by name."""
        return self._call("GET", "/schedules", params={"limit": limit, "cursor": cursor})

    def delete_schedule(self, name: str) -> dict[str, Any]:
        """Remove a schedule; the jobs it enqueued stay."""
        # A lost answer replayed would meet no schedule (404): not retried blindly.
        return self._call("DELETE", f"/schedules/{_segment(name)}", replay_safe=False)

    def retry_dead(self, *, queue: str | None = None, type: str | None = None,
                   ids: Iterable[str | uuid.UUID] | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        """Requeue dead jobs matching every given filter: {"requeued": n, "remaining": m}."""
        return self._call("POST", "/dlq/retry", body=_dead_filter(queue, type, ids, limit),
                          replay_safe=False)

    def purge_dead(self, *, queue: str | None = None, type: str | None = None,
                   ids: Iterable[str | uuid.UUID] | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        """Delete dead jobs matching every given filter: {"purged": n, "remaining": m}."""
        return self._call("POST", "/dlq/purge", body=_dead_filter(queue, type, ids, limit),
                          replay_safe=False)


def _worth_retrying(err: BaseException, replay_safe: bool) -> bool:
    """503 means the API kept nothing, and an unreachable API never saw the request: both are
    safe to send again. A request whose connection broke or timed out may have been served, so
    it is sent again only when its replay is harmless (every request but requeue)."""
    if not isinstance(err, ClientError):
        return False
    return err.status == 503 or err.code == "unreachable" or (
        err.code in ("connection_lost", "timeout") and replay_safe)


def _never_sent(err: requests.ConnectionError) -> bool:
    """True when the connection was never established (refused, unresolvable, connect timeout)."""
    reason = getattr(err.args[0] if err.args else None, "reason", None)
    return isinstance(err, requests.ConnectTimeout) or isinstance(reason, ConnectTimeoutError)


def _cause(err: requests.RequestException) -> str:
    """The useful end of urllib3's nested message ("[Errno 111] Connection refused")."""
    reason = getattr(err.args[0] if err.args else None, "reason", None) or err
    return str(reason).rsplit("): ", 1)[-1]


def job_spec(type: str, payload: Any = None, *, queue: str | None = None,
             priority: int | str | None = None, max_retries: int | None = None,
             timeout_s: float | None = None, delay_s: float | None = None,
             run_at: datetime | str | None = None,
             idempotency_key: str | None = None,
             limit_key: str | None = None) -> dict[str, Any]:
    """The JSON body of one enqueue; fields left None take the API's defaults."""
    spec: dict[str, Any] = {
        "type": type, "payload": payload, "queue": queue, "priority": priority,
        "max_retries": max_retries, "timeout_s": timeout_s, "delay_s": delay_s,
        "run_at": run_at.isoformat() if isinstance(run_at, datetime) else run_at,
        "idempotency_key": idempotency_key or str(uuid.uuid4()), "limit_key": limit_key,
    }
    return {k: v for k, v in spec.items() if v is not None}


def _dead_filter(queue: str | None, type: str | None,
                 ids: Iterable[str | uuid.UUID] | None, limit: int | None) -> dict[str, Any]:
    body = {"queue": queue, "type": type, "limit": limit,
            "ids": None if ids is None else [str(i) for i in ids]}
    return {k: v for k, v in body.items() if v is not None}


def _segment(value: str | uuid.UUID) -> str:
    """A job id or a name as one path segment: `../` in it cannot reach another endpoint."""
    return quote(str(value), safe="")
