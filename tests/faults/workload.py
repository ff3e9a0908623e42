"""The workload: a careful HTTP client that enqueues (and cancels, requeues) through the real API
and records every request and every answer in the history.

Invariant: each logical operation has one idempotency key for all of its tries, and is retried
with that same key after a connection error, a timeout or a 503 (honouring Retry-After, capped)
until its deadline; so a job the API committed before the client lost the answer is found again
by the retry, never duplicated. Every try is one history record: request id, idempotency key,
method and path, status, job id(s), monotonic and wall time of send and receipt, whether the
body was JSON and whether Retry-After was present, or the client-side error.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import requests

from tests.faults.history import History, stamp

REQUEST_TIMEOUT_S = 10.0
WAIT_S = REQUEST_TIMEOUT_S - 2
"""How long the API holds one waiting read: within the request's timeout."""
FINISHED = frozenset({"succeeded", "dead", "cancelled"})
RETRY_PAUSE_S = (0.05, 1.0)
RETRY_AFTER_CAP_S = 0.5


@dataclass
class Answer:
    """The end of one logical operation: its last status (None: never answered) and body."""

    op: str
    key: str | None
    status: int | None
    body: Any = None
    tries: int = 0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def job_id(self) -> str | None:
        return self.body.get("id") if self.ok and isinstance(self.body, dict) else None


@dataclass
class _Try:
    status: int | None = None
    body: Any = None
    is_json: bool = False
    retry_after: bool = False
    error: str | None = None
    request_id: str = ""
    times: dict[str, float] = field(default_factory=dict)


def job_ids_of(body: Any) -> list[str]:
    """The job ids an enqueue answer names (one job, or a batch)."""
    if not isinstance(body, dict):
        return []
    if "jobs" in body and isinstance(body["jobs"], list):
        return [j["job"]["id"] for j in body["jobs"] if isinstance(j, dict) and "job" in j]
    if "steps" in body and isinstance(body["steps"], list):  # a workflow: its steps' jobs
        return [s["job_id"] for s in body["steps"] if isinstance(s, dict) and "job_id" in s]
    return [body["id"]] if "id" in body else []


class Workload:
    """Thread-safe client of one API; `deadline_s` bounds the retries of one operation."""

    def __init__(self, api_url: str, history: History, deadline_s: float = 60.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.history = history
        self.deadline_s = deadline_s
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    # --- operations ----------------------------------------------------------------------

    def enqueue(self, job_type: str, payload: Any = None, **fields: Any) -> Answer:
        body = {"type": job_type, "payload": {} if payload is None else payload, **fields}
        return self.call("enqueue", "POST", "/api/v1/jobs", body, key=str(uuid.uuid4()))

    def enqueue_batch(self, jobs: list[dict[str, Any]]) -> Answer:
        """One batch request; each job gets its own idempotency key (kept across tries)."""
        keyed = [{**job, "idempotency_key": job.get("idempotency_key") or str(uuid.uuid4())}
                 for job in jobs]
        return self.call("enqueue", "POST", "/api/v1/jobs/batch", {"jobs": keyed}, key=None)

    def enqueue_batch_once(self, jobs: list[dict[str, Any]]) -> Answer:
        """One batch request without idempotency keys, sent exactly once: a lost answer cannot
        be retried without risking a second copy of every job, as a client without keys must
        accept. (A batch of COPY_MIN_JOBS or more such jobs takes the COPY path.)"""
        return self.call("enqueue", "POST", "/api/v1/jobs/batch", {"jobs": jobs}, key=None,
                         once=True)

    def submit_workflow(self, name: str, steps: list[dict[str, Any]]) -> Answer:
        """One workflow (all its steps in one transaction), one key for every try."""
        return self.call("workflow", "POST", "/api/v1/workflows",
                         {"name": name, "steps": steps}, key=str(uuid.uuid4()))

    def enqueue_unique(self, job_type: str, payload: Any, unique: dict[str, Any]) -> Answer:
        """One unique enqueue, retried with one idempotency key (checked before the unique
        key, so a retry whose first try committed gets that job back)."""
        return self.enqueue(job_type, payload, unique=unique)

    def debounce(self, job_type: str, arrival: str, group: str, delay_s: float,
                 **payload: Any) -> Answer:
        """One debounce arrival with the payload `{"arrival": arrival, ...}`, sent once: it may
        carry no idempotency key, so a retry whose first try committed would join twice. The
        history records which job the answer named (`debounce` entries, for the checker)."""
        body = {"type": job_type, "payload": {"arrival": arrival, **payload},
                "debounce": {"key": group, "delay_s": delay_s}}
        answer = self.call("enqueue", "POST", "/api/v1/jobs", body, key=None, once=True)
        self.history.record("debounce", arrival=arrival, group=group, job_id=answer.job_id)
        return answer

    def cancel(self, job_id: str) -> Answer:
        return self.call("cancel", "DELETE", f"/api/v1/jobs/{job_id}", None, key=None)

    def retry(self, job_id: str) -> Answer:
        return self.call("retry", "POST", f"/api/v1/jobs/{job_id}/retry", None, key=None)

    def get(self, job_id: str) -> Answer:
        return self.call("get", "GET", f"/api/v1/jobs/{job_id}", None, key=None)

    def wait(self, job_id: str, wait_s: float = WAIT_S) -> Answer:
        """The job once finished, as Client.wait asks: the API holds each answer up to
        `wait_s` and the request is asked again while the job is unfinished, until the
        deadline (then the last answer)."""
        deadline = time.monotonic() + self.deadline_s
        while True:
            answer = self.call("wait", "GET", f"/api/v1/jobs/{job_id}?wait_s={wait_s:g}", None,
                               key=None)
            status = _job_status(answer.body) if answer.status == 200 else None
            if status in FINISHED or answer.status != 200 or time.monotonic() > deadline:
                return answer

    def many(self, calls: Iterable[Callable[[], Answer]], threads: int = 8) -> list[Answer]:
        """Run operations concurrently; their answers in the order given."""
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda fn: fn(), list(calls)))

    @contextmanager
    def background(self, make: Callable[[int], Answer], threads: int = 2,
                   limit: int = 10_000) -> Iterator[list[Answer]]:
        """Keep issuing `make(i)` from `threads` threads until the block ends (or `limit`)."""
        answers: list[Answer] = []
        stop = threading.Event()
        counter = iter(range(limit))
        lock = threading.Lock()

        def loop() -> None:
            while not stop.is_set():
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                answers.append(make(i))

        pool = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
        for t in pool:
            t.start()
        try:
            yield answers
        finally:
            stop.set()
            for t in pool:
                t.join(self.deadline_s + REQUEST_TIMEOUT_S)

    # --- one operation, retried ----------------------------------------------------------

    def call(self, op: str, method: str, path: str, body: Any, *, key: str | None,
             retry_503: bool = True, once: bool = False) -> Answer:
        """Send until answered (not 503) or the deadline passes; same key on every try.
        `once`: a single try, whatever comes back (an operation that is not idempotent)."""
        op_id = str(uuid.uuid4())
        deadline = time.monotonic() + self.deadline_s
        pause = RETRY_PAUSE_S[0]
        tries = 0
        while True:
            tries += 1
            t = self._send(method, path, body, key)
            self._record(op, op_id, key, method, path, tries, t)
            retryable = not once and (t.status is None or (retry_503 and t.status == 503))
            if not retryable or time.monotonic() + pause > deadline:
                return Answer(op_id, key, t.status, t.body, tries)
            wait = min(pause, RETRY_AFTER_CAP_S) if t.retry_after else pause
            time.sleep(wait)
            pause = min(pause * 2, RETRY_PAUSE_S[1])

    def _send(self, method: str, path: str, body: Any, key: str | None) -> _Try:
        headers = {"X-Request-Id": str(uuid.uuid4())}
        if key is not None:
            headers["Idempotency-Key"] = key
        t = _Try(request_id=headers["X-Request-Id"],
                 times={f"sent_{k}": v for k, v in stamp().items()})
        try:
            response = self._session().request(method, self.api_url + path, json=body,
                                               headers=headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as err:
            t.error = type(err).__name__
            self._local.session = None  # a broken keep-alive connection must not be reused
        else:
            t.status = response.status_code
            t.retry_after = "Retry-After" in response.headers
            try:
                t.body, t.is_json = response.json(), True
            except ValueError:
                t.body = response.text[:500]
        t.times.update({f"recv_{k}": v for k, v in stamp().items()})
        return t

    def _record(self, op: str, op_id: str, key: str | None, method: str, path: str, n: int,
                t: _Try) -> None:
        self.history.record(
            "request", op=op, op_id=op_id, request_id=t.request_id, key=key, method=method,
            path=path, try_no=n,
            status=t.status, error=t.error, json=t.is_json, retry_after=t.retry_after,
            job_ids=job_ids_of(t.body) if t.status and t.status < 300 else [],
            error_code=_error_code(t.body), job_status=_job_status(t.body), **t.times)


def _job_status(body: Any) -> str | None:
    """The status a job answer carries (a read or a wait), None for any other answer."""
    if isinstance(body, dict) and isinstance(body.get("status"), str):
        return body["status"]
    return None


def _error_code(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("code")
    return None
