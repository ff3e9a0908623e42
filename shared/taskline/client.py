"""Python clients of the taskline HTTP API (v1): `Client` for threads, `AsyncClient` for asyncio.

Invariant: a retried request can never create a second job. Every enqueue carries an
idempotency key (one the caller names, or one the client makes: a per-client random prefix and
a counter, UUID-shaped, costing a string format rather than a random draw per job), and a
retried request sends the same bytes, key included, as its first try; so when an answer is lost
or the API says 503 and the client sends the request again, the API returns the job the first
try created. 503 answers are retried after their Retry-After, a bounded number of times; a
request that never reached the API (connection refused, connect timeout) is retried too, and
one whose connection broke mid-way only when replaying it is harmless. An unkeyed batch
(`enqueue_batch(..., keyed=False)`, the API's COPY path) is never retried: nothing would tell
its replay from a second batch. Any other failure is raised as `ClientError` carrying the
API's error shape `{"error": {"code", "message", "details"}}`.

Each client holds one pool of kept-alive connections (taskline.transport), shared by the
threads (or tasks) that use it.

    client = Client("http://127.0.0.1:8000", token="...")
    job = client.enqueue("webhook", {"url": "https://example.com/hook"}, priority="high")
    result = client.wait(job["id"], timeout=30)   # JobFailed / JobCancelled if it did not succeed

    async with AsyncClient("http://127.0.0.1:8000") as client:
        job = await client.enqueue("webhook", {"url": "https://example.com/hook"})
"""


from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

import orjson

from taskline import transport
from taskline.results import (
    TERMINAL_STATUSES,
    WORKFLOW_FINISHED,
    outcome,
    workflow_outcome,
)
from taskline.transport import Answer

API_PREFIX = "/api/v1"
MAX_WAIT_S = 30.0
"""The longest one waiting request is held by the API (`wait_s`); `wait` re-issues it."""
EARLY_PAUSE_S = 0.2


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
    def from_response(cls, response: Any) -> ClientError:
        """Read the API's error shape from a response (its `status_code`, `headers` and
        `content`); anything else (a proxy's HTML page) is summarised."""
        try:
            error = _loads(response.content)["error"]
            code, message = str(error["code"]), str(error["message"])
            details = error.get("details")
        except (ValueError, KeyError, TypeError):
            text = response.content[:200].decode("utf-8", "replace")
            code, message, details = f"http_{response.status_code}", text, None
        return cls(response.status_code, code, message, details,
                   _retry_after(response.headers.get("retry-after")))


_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()
"""Every live client of this process, for _after_fork."""


def _after_fork() -> None:
    """In a forked child: new keys for every client (the parent's counter goes on in the
    parent), and none of the parent's connections (a socket two processes write is garbage)."""
    for client in list(_CLIENTS):
        client._fresh_keys()
        client._pool.forget()


os.register_at_fork(after_in_child=_after_fork)


def _retry_after(value: str | None) -> float | None:
    if value and value.strip().isdigit():
        return float(value.strip())
    return None


class Client:
    """A small, thread-safe client: one pool of kept-alive connections per Client."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, *,
                 attempts: int = 4, max_wait_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep, pool_size: int = 10) -> None:
        """`attempts` bounds the tries of one request (503 / unreachable); `max_wait_s` caps
        the wait between tries, whatever Retry-After asks; `pool_size` bounds the idle
        connections kept for reuse (threads beyond it open and close their own)."""
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        origin = transport.Origin.parse(self.base_url)
        self._prefix = urlsplit(self.base_url).path.rstrip("/") + API_PREFIX
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._pool = self._make_pool(origin, timeout, pool_size)
        self._fresh_keys()
        _CLIENTS.add(self)

    def _fresh_keys(self) -> None:
        # UUID-shaped keys: 70 random bits per client, then a counter (2**48 keys per client).
        # A forked child draws its own (see _after_fork): two processes never share a key.
        self._key_base = str(uuid.uuid4())[:24]
        self._key_counter = itertools.count()

    def _make_pool(self, origin: transport.Origin, timeout: float, size: int) -> Any:
        return transport.SyncPool(origin, timeout, size)

    def new_key(self) -> str:
        """A fresh idempotency key, unique to this client's process and this call."""
        return f"{self._key_base}{next(self._key_counter):012x}"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._pool.close()

    # -- jobs -------------------------------------------------------------------------------

    def enqueue(self, type: str, payload: Any = None, *, queue: str | None = None,
                priority: int | str | None = None, max_retries: int | None = None,
                timeout_s: float | None = None, delay_s: float | None = None,
                run_at: datetime | str | None = None,
                idempotency_key: str | None = None,
                limit_key: str | None = None, unique: Mapping[str, Any] | None = None,
                debounce: Mapping[str, Any] | None = None, ordering_key: str | None = None,
                tags: Sequence[str] | None = None, expires_at: datetime | str | None = None,
                start_within_s: float | None = None) -> dict[str, Any]:
        """Enqueue one job and return it (status 201 new, 200 when the key was seen before).

        `unique` (`{"key", "period_s", "states", "on_conflict"}`, each optional) answers with
        the job already holding the key (`"duplicate": true`); `debounce` (`{"key",
        "delay_s"}`) joins the job of its group still waiting out its delay
        (`"debounced": true`). A debounced enqueue carries no idempotency key (the API refuses
        one), so it is retried only when it never reached the API: a replay would join twice.
        """
        semantics = {"ordering_key": ordering_key, "tags": tags, "expires_at": expires_at,
                     "start_within_s": start_within_s}
        if debounce is not None:
            spec = job_spec(type, payload, queue=queue, priority=priority,
                            max_retries=max_retries, timeout_s=timeout_s, limit_key=limit_key,
                            debounce=debounce, keyed=False, **semantics)
            return self._call("POST", "/jobs", body=spec, replay_safe=False)
        spec = job_spec(type, payload, queue=queue, priority=priority, max_retries=max_retries,
                        timeout_s=timeout_s, delay_s=delay_s, run_at=run_at,
                        idempotency_key=idempotency_key or self.new_key(),
                        limit_key=limit_key, unique=unique, **semantics)
        return self._call("POST", "/jobs", body=spec)

    def enqueue_batch(self, specs: Iterable[Mapping[str, Any]], *, keyed: bool = True) -> Any:
        """Enqueue up to 1,000 jobs in one transaction; each spec takes `enqueue`'s fields.

        `keyed=False` sends the jobs without keys (except those a spec names): the API writes
        such a batch by COPY, the fastest path, and the client never retries it by itself, as
        a replay would enqueue the batch twice.
        """
        if not keyed:
            jobs = [job_spec(**dict(spec), keyed=False) for spec in specs]
            return self._call("POST", "/jobs/batch", body={"jobs": jobs}, replay_safe=False,
                              retried=False)
        jobs = [job_spec(**dict(spec), keyed=False) for spec in specs]
        for job in jobs:
            if "debounce" not in job:  # the API refuses a key on a debounced job
                job.setdefault("idempotency_key", self.new_key())
        # A batch holding a debounced job cannot be replayed harmlessly (it would join twice).
        replay_safe = not any("debounce" in job for job in jobs)
        return self._call("POST", "/jobs/batch", body={"jobs": jobs}, replay_safe=replay_safe)

    def get(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """The job with its attempts, lease, last error, result and event history."""
        return self._call("GET", f"/jobs/{_segment(job_id)}")

    def list(self, status: str | None = None, type: str | None = None,
             queue: str | None = None, limit: int | None = None,
             cursor: str | None = None, tag: str | None = None) -> dict[str, Any]:
        """One page of jobs matching the filters; pass the page's cursor to get the next."""
        params = {"status": status, "type": type, "queue": queue, "limit": limit,
                  "cursor": cursor, "tag": tag}
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

    def dlq_groups(self, queue: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """Dead jobs grouped by the cause of their final error, most jobs first: {"groups":
        [{"fingerprint", "count", "types", "queues", "sample_error", "first_seen",
        "last_seen"}]}; pass a group's fingerprint to retry_dead or purge_dead."""
        return self._call("GET", "/dlq/groups", params={"queue": queue, "limit": limit})

    def workers(self) -> dict[str, Any]:
        """The live worker registry: heartbeats and active jobs."""
        return self._call("GET", "/workers")

    def types(self) -> dict[str, Any]:
        """The job types declared by workers seen within TASKLINE_TYPE_TTL_S: {"types":
        [{"type", "queue", "schema", "workers", "last_seen", "schemas"}]}, `schemas` holding
        each declared version (its queue, JSON Schema, workers and last_seen), newest first."""
        return self._call("GET", "/types")

    def queues(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of queues by name (`limit`, from `cursor`, the previous page's
        `next_cursor`) with their depths per priority and state, the totals over every queue,
        and the dispatch mode."""
        return self._call("GET", "/queues", params={"limit": limit, "cursor": cursor})

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

    def wait(self, job_id: str | uuid.UUID, timeout: float | None = None,
             raise_on_failure: bool = True) -> Any:
        """Wait until the job is finished and return its result; raise taskline.JobFailed
        (dead: `error`, `attempts`) or taskline.JobCancelled. With `raise_on_failure=False`,
        return the finished job instead (as before 0.2). TimeoutError after `timeout` seconds
        (None: no limit). The API holds each request until the job finishes (at most 30 s):
        no polling, one request per 30 s of waiting."""
        path = f"/jobs/{_segment(job_id)}"
        deadline = _deadline(timeout)
        while True:
            seconds, sent = _wait_s(deadline), time.monotonic()
            job = self._call("GET", path, params={"wait_s": seconds}, timeout=self._held(seconds))
            if job.get("status") in TERMINAL_STATUSES:
                return outcome(job, raise_on_failure)
            if _expired(deadline):
                raise TimeoutError(f"job {job_id} is still {job.get('status')} after {timeout}s")
            self._sleep(_pause(sent, seconds))

    def wait_workflow(self, workflow_id: str | uuid.UUID, timeout: float | None = None,
                      raise_on_failure: bool = True) -> dict[str, Any]:
        """Wait until the workflow is no longer running and return it (its first page of
        steps); raise JobFailed when it failed, JobCancelled when it was cancelled (unless
        `raise_on_failure` is false), TimeoutError after `timeout` seconds."""
        path = f"/workflows/{_segment(workflow_id)}"
        deadline = _deadline(timeout)
        while True:
            seconds, sent = _wait_s(deadline), time.monotonic()
            view = self._call("GET", path, params={"wait_s": seconds},
                              timeout=self._held(seconds))
            if view.get("status") in WORKFLOW_FINISHED:
                return workflow_outcome(view, raise_on_failure)
            if _expired(deadline):
                raise TimeoutError(f"workflow {workflow_id} is still running after {timeout}s")
            self._sleep(_pause(sent, seconds))

    def _held(self, wait_s: float) -> float:
        """The transport timeout of a request the API may hold `wait_s` seconds."""
        return wait_s + self.timeout

    # -- workflows ----------------------------------------------------------------------------

    def submit_workflow(self, name: str, steps: Iterable[Mapping[str, Any]], *,
                        idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a workflow: `steps` of `{"id", "job": {enqueue's fields}, "after": [ids]}`,
        each with an optional `"when"` (`all_succeeded`, the default; `any_failed`; `always`:
        docs/workflows.md), inserted whole in one transaction. Returns the workflow with each
        step's job id."""
        body = {"name": name, "steps": [dict(step) for step in steps],
                "idempotency_key": idempotency_key or str(uuid.uuid4())}
        return self._call("POST", "/workflows", body=body)

    def workflow(self, workflow_id: str | uuid.UUID, limit: int | None = None,
                 cursor: str | None = None) -> dict[str, Any]:
        """A workflow's derived status, step counts and one page of its steps (`limit` steps
        from `cursor`, the previous page's `next_cursor`; `next_cursor` null on the last)."""
        return self._call("GET", f"/workflows/{_segment(workflow_id)}",
                          params={"limit": limit, "cursor": cursor})

    def workflows(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of workflows, newest first, each with its step counts (not its steps)."""
        return self._call("GET", "/workflows", params={"limit": limit, "cursor": cursor})

    def cancel_workflow(self, workflow_id: str | uuid.UUID) -> dict[str, Any]:
        """Cancel every step not started yet and ask running ones to stop."""
        return self._call("DELETE", f"/workflows/{_segment(workflow_id)}")

    # -- transport ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, body: Any = None,
              params: Mapping[str, Any] | None = None, replay_safe: bool = True,
              retried: bool = True, timeout: float | None = None) -> Any:
        """Send one request, retried by the rules in the module docstring (never when
        `retried` is false); the answer's JSON, or ClientError. `timeout` overrides the
        client's for this request."""
        target, headers, data = self._request(path, body, params)
        attempt = 1
        while True:
            try:
                return _result(method, path, self._send(method, target, headers, data,
                                                        timeout))
            except ClientError as err:
                if not retried or attempt >= self.attempts or not _worth_retrying(
                        err, replay_safe):
                    raise
                self._sleep(self._wait(err, attempt))
                attempt += 1

    def _request(self, path: str, body: Any, params: Mapping[str, Any] | None,
                 ) -> tuple[str, dict[str, str], bytes | None]:
        """The target, headers and body of a request, built once for all of its tries."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        target = self._prefix + path + ("?" + urlencode(query) if query else "")
        if body is None:
            return target, self._headers, None
        return target, {**self._headers, "Content-Type": "application/json"}, _dumps(body)

    def _send(self, method: str, target: str, headers: dict[str, str],
              data: bytes | None, timeout: float | None = None) -> Answer:
        try:
            return self._pool.request(method, target, headers, data, timeout)
        except transport.TransportError as err:
            raise _transport_error(err, self.base_url, method, target) from None

    def _wait(self, err: ClientError, attempt: int) -> float:
        if err.retry_after_s is not None:
            return min(err.retry_after_s, self.max_wait_s)
        return min(0.2 * 2 ** (attempt - 1), self.max_wait_s)

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
                   ids: Iterable[str | uuid.UUID] | None = None, limit: int | None = None,
                   fingerprint: str | None = None) -> dict[str, Any]:
        """Requeue dead jobs matching every given filter (`fingerprint`: a group of
        dlq_groups): {"requeued": n, "remaining": m}."""
        return self._call("POST", "/dlq/retry",
                          body=_dead_filter(queue, type, ids, limit, fingerprint),
                          replay_safe=False)

    def purge_dead(self, *, queue: str | None = None, type: str | None = None,
                   ids: Iterable[str | uuid.UUID] | None = None, limit: int | None = None,
                   fingerprint: str | None = None) -> dict[str, Any]:
        """Delete dead jobs matching every given filter (`fingerprint`: a group of
        dlq_groups): {"purged": n, "remaining": m}."""
        return self._call("POST", "/dlq/purge",
                          body=_dead_filter(queue, type, ids, limit, fingerprint),
                          replay_safe=False)


def _worth_retrying(err: BaseException, replay_safe: bool) -> bool:
    """503 means the API kept nothing, and an unreachable API never saw the request: both are
    safe to send again. A request whose connection broke or timed out may have been served, so
    it is sent again only when its replay is harmless (every request but requeue)."""
    if not isinstance(err, ClientError):
        return False
    return err.status == 503 or err.code == "unreachable" or (
        err.code in ("connection_lost", "timeout") and replay_safe)


def _transport_error(err: transport.TransportError, base_url: str, method: str,
                     target: str) -> ClientError:
    if isinstance(err, transport.Unreachable):
        return ClientError(0, "unreachable", f"cannot reach {base_url}: {err}")
    code = "timeout" if isinstance(err, transport.TimedOut) else "connection_lost"
    return ClientError(0, code, f"{method} {target}: {err}")


def _result(method: str, path: str, answer: Answer) -> Any:
    """The JSON of a successful answer ({} when empty), else its ClientError."""
    if not 200 <= answer.status_code < 400:
        raise ClientError.from_response(answer)
    if answer.status_code == 204 or not answer.content:
        return {}
    try:
        return _loads(answer.content)
    except ValueError:
        raise ClientError(answer.status_code, "invalid_response",
                          "the API answered with something other than JSON") from None


def _dumps(body: Any) -> bytes:
    """JSON by orjson, or the standard library for what orjson refuses (an integer past 64
    bits, a subclass it does not know)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # an integer past 64 bits, or a true error (ValueError)


def job_spec(type: str, payload: Any = None, *, queue: str | None = None,
             priority: int | str | None = None, max_retries: int | None = None,
             timeout_s: float | None = None, delay_s: float | None = None,
             run_at: datetime | str | None = None,
             idempotency_key: str | None = None, limit_key: str | None = None,
             unique: Mapping[str, Any] | None = None,
             debounce: Mapping[str, Any] | None = None,
             ordering_key: str | None = None, tags: Sequence[str] | None = None,
             expires_at: datetime | str | None = None, start_within_s: float | None = None,
             keyed: bool = True) -> dict[str, Any]:
    """The JSON body of one enqueue; fields left None take the API's defaults. Without an
    `idempotency_key`, a fresh one is made unless `keyed` is false (or the job is debounced:
    the API refuses a key on a debounced job)."""
    keyed = keyed and debounce is None
    spec: dict[str, Any] = {
        "type": type, "payload": payload, "queue": queue, "priority": priority,
        "max_retries": max_retries, "timeout_s": timeout_s, "delay_s": delay_s,
        "run_at": run_at.isoformat() if isinstance(run_at, datetime) else run_at,
        "idempotency_key": idempotency_key or (str(uuid.uuid4()) if keyed else None),
        "limit_key": limit_key,
        "unique": None if unique is None else dict(unique),
        "debounce": None if debounce is None else dict(debounce),
        "ordering_key": ordering_key,
        "tags": None if tags is None else list(tags),
        "expires_at": expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at,
        "start_within_s": start_within_s,
    }
    return {k: v for k, v in spec.items() if v is not None}


def _dead_filter(queue: str | None, type: str | None, ids: Iterable[str | uuid.UUID] | None,
                 limit: int | None, fingerprint: str | None = None) -> dict[str, Any]:
    body = {"queue": queue, "type": type, "limit": limit, "fingerprint": fingerprint,
            "ids": None if ids is None else [str(i) for i in ids]}
    return {k: v for k, v in body.items() if v is not None}


def _segment(value: str | uuid.UUID) -> str:
    """A job id or a name as one path segment: `../` in it cannot reach another endpoint."""
    return quote(str(value), safe="")


class AsyncClient(Client):
    """The same methods as `Client` for asyncio producers, each awaited: `await
    client.enqueue(...)`. One pool of kept-alive connections per client, used from one event
    loop; retries wait with `asyncio.sleep` (or the `sleep` coroutine function given).

    Every method of Client that returns `self._call(...)` works here unchanged: `_call` is a
    coroutine function in this class, so such a method returns the awaitable of its answer.
    """

    if TYPE_CHECKING:
        # What a type checker sees of the inherited requests: each one awaited. At run time
        # they are Client's own methods returning `_call`'s awaitable (see above).
        async def enqueue(  # type: ignore[override]
                self, type: str, payload: Any = None, *, queue: str | None = None,
                priority: int | str | None = None, max_retries: int | None = None,
                timeout_s: float | None = None, delay_s: float | None = None,
                run_at: datetime | str | None = None, idempotency_key: str | None = None,
                limit_key: str | None = None, unique: Mapping[str, Any] | None = None,
                debounce: Mapping[str, Any] | None = None,
                ordering_key: str | None = None,
                tags: Sequence[str] | None = None,
                expires_at: datetime | str | None = None,
                start_within_s: float | None = None) -> dict[str, Any]: ...
        async def enqueue_batch(  # type: ignore[override]
                self, specs: Iterable[Mapping[str, Any]], *, keyed: bool = True) -> Any: ...
        async def get(  # type: ignore[override]
                self, job_id: str | uuid.UUID) -> dict[str, Any]: ...
        async def list(  # type: ignore[override]
                self, status: str | None = None, type: str | None = None, queue: str | None = None,
                limit: int | None = None, cursor: str | None = None,
                tag: str | None = None) -> dict[str, Any]: ...
        async def cancel(  # type: ignore[override]
                self, job_id: str | uuid.UUID) -> dict[str, Any]: ...
        async def retry(  # type: ignore[override]
                self, job_id: str | uuid.UUID) -> dict[str, Any]: ...
        async def dlq(  # type: ignore[override]
                self, queue: str | None = None, limit: int | None = None,
                cursor: str | None = None) -> dict[str, Any]: ...
        async def dlq_groups(  # type: ignore[override]
                self, queue: str | None = None, limit: int | None = None) -> dict[str, Any]: ...
        async def workers(self) -> dict[str, Any]: ...  # type: ignore[override]
        async def queues(  # type: ignore[override]
                self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]: ...
        async def audit(  # type: ignore[override]
                self, actor: str | None = None, action: str | None = None, limit: int | None = None,
                cursor: str | None = None) -> dict[str, Any]: ...
        async def whoami(self) -> dict[str, Any]: ...  # type: ignore[override]
        async def pause_queue(self, queue: str) -> dict[str, Any]: ...  # type: ignore[override]
        async def resume_queue(self, queue: str) -> dict[str, Any]: ...  # type: ignore[override]
        async def set_limit(  # type: ignore[override]
                self, scope: str, *, concurrency: int | None = None, rate: int | None = None,
                period_s: float | None = None, per_key: bool = False) -> dict[str, Any]: ...
        async def limits(self) -> dict[str, Any]: ...  # type: ignore[override]
        async def delete_limit(self, scope: str) -> dict[str, Any]: ...  # type: ignore[override]
        async def submit_workflow(  # type: ignore[override]
                self, name: str, steps: Iterable[Mapping[str, Any]], *,
                idempotency_key: str | None = None) -> dict[str, Any]: ...
        async def workflow(  # type: ignore[override]
                self, workflow_id: str | uuid.UUID, limit: int | None = None,
                cursor: str | None = None) -> dict[str, Any]: ...
        async def workflows(  # type: ignore[override]
                self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]: ...
        async def cancel_workflow(  # type: ignore[override]
                self, workflow_id: str | uuid.UUID) -> dict[str, Any]: ...
        async def set_schedule(  # type: ignore[override]
                self, name: str, cron: str, job: Mapping[str, Any], *, timezone: str | None = None,
                paused: bool | None = None, catch_up: str | None = None) -> dict[str, Any]: ...
        async def schedule(self, name: str) -> dict[str, Any]: ...  # type: ignore[override]
        async def schedules(  # type: ignore[override]
                self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]: ...
        async def delete_schedule(self, name: str) -> dict[str, Any]: ...  # type: ignore[override]
        async def retry_dead(  # type: ignore[override]
                self, *, queue: str | None = None, type: str | None = None,
                ids: Iterable[str | uuid.UUID] | None = None, limit: int | None = None,
                fingerprint: str | None = None) -> dict[str, Any]: ...
        async def purge_dead(  # type: ignore[override]
                self, *, queue: str | None = None, type: str | None = None,
                ids: Iterable[str | uuid.UUID] | None = None, limit: int | None = None,
                fingerprint: str | None = None) -> dict[str, Any]: ...

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, *,
                 attempts: int = 4, max_wait_s: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 pool_size: int = 10) -> None:
        super().__init__(url, token, timeout, attempts=attempts, max_wait_s=max_wait_s,
                         pool_size=pool_size)
        self._async_sleep = sleep

    def _make_pool(self, origin: transport.Origin, timeout: float, size: int) -> Any:
        return transport.AsyncPool(origin, timeout, size)

    def __enter__(self) -> AsyncClient:
        raise TypeError("an AsyncClient is entered with `async with`")

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.close()

    def close(self) -> Any:
        """The awaitable closing of the pool (`await client.close()`), as `aclose`."""
        return self.aclose()

    async def _call(self, method: str, path: str, *, body: Any = None,
                    params: Mapping[str, Any] | None = None, replay_safe: bool = True,
                    retried: bool = True, timeout: float | None = None) -> Any:
        target, headers, data = self._request(path, body, params)
        attempt = 1
        while True:
            try:
                return _result(method, path, await self._send_async(method, target, headers,
                                                                    data, timeout))
            except ClientError as err:
                if not retried or attempt >= self.attempts or not _worth_retrying(
                        err, replay_safe):
                    raise
                await self._async_sleep(self._wait(err, attempt))
                attempt += 1

    async def _send_async(self, method: str, target: str, headers: dict[str, str],
                          data: bytes | None, timeout: float | None = None) -> Answer:
        try:
            return await self._pool.request(method, target, headers, data, timeout)
        except transport.TransportError as err:
            raise _transport_error(err, self.base_url, method, target) from None

    async def types(self) -> dict[str, Any]:  # type: ignore[override]
        """`Client.types`, awaited."""
        return await self._call("GET", "/types")  # type: ignore[no-any-return]

    async def wait(self, job_id: str | uuid.UUID,  # type: ignore[override]
                   timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        """`Client.wait`, awaited."""
        path = f"/jobs/{_segment(job_id)}"
        deadline = _deadline(timeout)
        while True:
            seconds, sent = _wait_s(deadline), time.monotonic()
            job = await self._call("GET", path, params={"wait_s": seconds},
                                   timeout=self._held(seconds))
            if job.get("status") in TERMINAL_STATUSES:
                return outcome(job, raise_on_failure)
            if _expired(deadline):
                raise TimeoutError(f"job {job_id} is still {job.get('status')} after {timeout}s")
            await self._async_sleep(_pause(sent, seconds))

    async def wait_workflow(self, workflow_id: str | uuid.UUID,  # type: ignore[override]
                            timeout: float | None = None,
                            raise_on_failure: bool = True) -> dict[str, Any]:
        """`Client.wait_workflow`, awaited."""
        path = f"/workflows/{_segment(workflow_id)}"
        deadline = _deadline(timeout)
        while True:
            seconds, sent = _wait_s(deadline), time.monotonic()
            view = await self._call("GET", path, params={"wait_s": seconds},
                                    timeout=self._held(seconds))
            if view.get("status") in WORKFLOW_FINISHED:
                return workflow_outcome(view, raise_on_failure)
            if _expired(deadline):
                raise TimeoutError(f"workflow {workflow_id} is still running after {timeout}s")
            await self._async_sleep(_pause(sent, seconds))


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _pause(sent: float, wait_s: float) -> float:
    """Seconds to pause before asking again about a job still unfinished: none after an
    answer the API held, EARLY_PAUSE_S after one that came at once (an API of a release
    before `wait_s`, during a rolling deploy), so the client never asks in a tight loop."""
    held = time.monotonic() - sent
    return EARLY_PAUSE_S if held < min(wait_s, EARLY_PAUSE_S * 5) / 2 else 0.0


def _wait_s(deadline: float | None) -> float:
    """The `wait_s` of the next waiting request: what is left, at most MAX_WAIT_S."""
    if deadline is None:
        return MAX_WAIT_S
    return round(min(max(deadline - time.monotonic(), 0.0), MAX_WAIT_S), 3)
