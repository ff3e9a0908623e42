"""Client commands of the `taskline` CLI: enqueue, status, cancel, dlq, workers, types,
queues, schedules.

Invariant: every command talks to the API only through `taskline.client.Client`, prints a
readable table (or, with --json, the API's JSON unchanged) on stdout, and exits 0 on success,
1 when the API refused or could not be reached (the message on stderr), 2 on a usage error.
`--url` defaults to $TASKLINE_URL or http://127.0.0.1:8000, `--token` to $TASKLINE_TOKEN.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from taskline.client import Client, ClientError
from taskline.settings import Settings
from taskline_cli.auditcmds import add_verify_command

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_OK, EXIT_API, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 128 + 13
"""The reader of the output went away (`taskline status ID | head`): what a shell reports for a
program SIGPIPE ended, as for cat or ls."""
CELL_CHARS = 60

Command = Callable[[argparse.Namespace, Client], int]


class UsageError(Exception):
    """The command line is well-formed but its values are not usable (exit 2)."""


def entity_id(text: str) -> str:
    """An id argument (a job's or a workflow's): a UUID, or a usage error naming what was
    given, rather than the API's 404 for a path it has no route for."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an id: ids are UUIDs, as `taskline enqueue` prints them") from None


def client_command(fn: Command) -> Callable[[argparse.Namespace, Settings], int]:
    """Give `fn` a Client built from --url/--token and turn failures into exit codes."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace, settings: Settings) -> int:
        try:
            with Client(args.url, token=args.token, timeout=args.http_timeout) as client:
                code = fn(args, client)
            sys.stdout.flush()  # here, where a reader gone away is caught, not at exit
            return code
        except UsageError as err:
            print(f"taskline {args.command}: {err}", file=sys.stderr)
            return EXIT_USAGE
        except ClientError as err:
            print(f"taskline {args.command}: {_describe(err)}", file=sys.stderr)
            return EXIT_API
        except TimeoutError as err:
            print(f"taskline {args.command}: {err}", file=sys.stderr)
            return EXIT_API
        except BrokenPipeError:
            # Nothing more can be written: the interpreter's last flush must not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_PIPE

    return run


def _describe(err: ClientError) -> str:
    text = str(err)
    if err.details:
        text += "\n" + json.dumps(err.details, indent=2, ensure_ascii=False)
    return text


# -- commands --------------------------------------------------------------------------------

@client_command
def cmd_enqueue(args: argparse.Namespace, client: Client) -> int:
    job = client.enqueue(
        args.type, _payload(args.payload), queue=args.queue, priority=_priority(args.priority),
        max_retries=args.max_retries, timeout_s=args.timeout, delay_s=args.delay,
        run_at=args.run_at, idempotency_key=args.idempotency_key, limit_key=args.limit_key,
        unique=_unique(args), debounce=_debounce(args),
        ordering_key=args.ordering_key, tags=args.tag, expires_at=args.expires_at,
        start_within_s=args.start_within)
    if not args.wait:
        folded = [name for name in ("duplicate", "replaced", "debounced") if job.get(name)]
        _emit(args, job, lambda: print("  ".join([f"{job.get('id')}", f"{job.get('status')}",
                                                  *folded])))
        return EXIT_OK
    # The finished job itself, whatever its end (the exit status says it): one held request
    # per 30 s of waiting, answered at the commit that finishes the job.
    final = client.wait(job["id"], timeout=args.wait_timeout, raise_on_failure=False)
    _emit(args, final, lambda: _print_job(final, events=False))
    return EXIT_OK if final.get("status") == "succeeded" else EXIT_API


def _unique(args: argparse.Namespace) -> dict[str, Any] | None:
    """`unique` from --unique and its options (any option alone implies --unique)."""
    unique: dict[str, Any] = {}
    if args.unique_key is not None:
        unique["key"] = args.unique_key
    if args.unique_period is not None:
        unique["period_s"] = args.unique_period
    if args.unique_states is not None:
        unique["states"] = [s.strip() for s in args.unique_states.split(",") if s.strip()]
    if getattr(args, "replace", False):  # `schedule set` takes no --replace
        unique["on_conflict"] = "replace"
    return unique if unique or args.unique else None


def _debounce(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.debounce_key is None and args.debounce_delay is None:
        return None
    return {k: v for k, v in (("key", args.debounce_key), ("delay_s", args.debounce_delay))
            if v is not None}


@client_command
def cmd_status(args: argparse.Namespace, client: Client) -> int:
    job = client.get(args.id)
    _emit(args, job, lambda: _print_job(job, events=True))
    return EXIT_OK


@client_command
def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    job = client.cancel(args.id)
    _emit(args, job, lambda: print(f"{job.get('id', args.id)}  {job.get('status', 'cancelled')}"))
    return EXIT_OK


@client_command
def cmd_dlq_list(args: argparse.Namespace, client: Client) -> int:
    page = client.dlq(queue=args.queue, limit=args.limit, cursor=args.cursor)
    _emit(args, page, lambda: _print_page(page, DLQ_COLUMNS))
    return EXIT_OK


@client_command
def cmd_dlq_groups(args: argparse.Namespace, client: Client) -> int:
    groups = client.dlq_groups(queue=args.queue, limit=args.limit)
    _emit(args, groups, lambda: _print_page(groups, DLQ_GROUP_COLUMNS))
    return EXIT_OK


@client_command
def cmd_dlq_retry(args: argparse.Namespace, client: Client) -> int:
    if args.id is None or args.queue or args.type or args.ids or args.limit or args.fingerprint:
        return _dlq_bulk(args, client.retry_dead, "requeued")
    job = client.retry(args.id)
    _emit(args, job, lambda: print(f"{job.get('id', args.id)}  {job.get('status', 'queued')}"))
    return EXIT_OK


@client_command
def cmd_dlq_purge(args: argparse.Namespace, client: Client) -> int:
    return _dlq_bulk(args, client.purge_dead, "purged")


def _bulk_filter(args: argparse.Namespace) -> dict[str, Any]:
    """--queue, --type, --id (repeatable; a positional id counts as one), --fingerprint and
    --limit."""
    ids = [*(args.ids or []), *([args.id] if getattr(args, "id", None) else [])]
    found = {"queue": args.queue, "type": args.type, "ids": ids or None,
             "fingerprint": args.fingerprint}
    found = {k: v for k, v in found.items() if v is not None}
    if not found:
        raise UsageError("give at least one of --queue, --type, --id, --fingerprint")
    return found


def _dlq_bulk(args: argparse.Namespace, action: Callable[..., dict[str, Any]],
              done: str) -> int:
    result = action(**_bulk_filter(args), limit=args.limit)
    _emit(args, result, lambda: print(f"{done} {result.get(done)}  "
                                      f"remaining {result.get('remaining')}"))
    return EXIT_OK


@client_command
def cmd_schedules_list(args: argparse.Namespace, client: Client) -> int:
    page = client.schedules(limit=args.limit, cursor=args.cursor)
    _emit(args, page, lambda: _print_page({**page, "schedules": [
        _with_next_run(s) for s in page.get("schedules", [])]}, SCHEDULE_COLUMNS))
    return EXIT_OK


def _with_next_run(schedule: dict[str, Any]) -> dict[str, Any]:
    return {**schedule, "next_run": (schedule.get("next_runs") or [None])[0]}


@client_command
def cmd_schedules_set(args: argparse.Namespace, client: Client) -> int:
    job = {"type": args.type, "payload": _payload(args.payload), "queue": args.queue,
           "priority": _priority(args.priority), "max_retries": args.max_retries,
           "timeout_s": args.timeout, "unique": _unique(args)}
    schedule = client.set_schedule(
        args.name, args.cron, {k: v for k, v in job.items() if v is not None},
        timezone=args.timezone, paused=args.paused, catch_up=args.catch_up)
    _emit(args, schedule, lambda: print(table([_with_next_run(schedule)], SCHEDULE_COLUMNS)))
    return EXIT_OK


@client_command
def cmd_schedules_delete(args: argparse.Namespace, client: Client) -> int:
    result = client.delete_schedule(args.name)
    _emit(args, result, lambda: print(f"{args.name}  deleted"))
    return EXIT_OK


@client_command
def cmd_workers(args: argparse.Namespace, client: Client) -> int:
    data = client.workers()
    _emit(args, data, lambda: _print_page(data, WORKER_COLUMNS))
    return EXIT_OK


@client_command
def cmd_types(args: argparse.Namespace, client: Client) -> int:
    data = client.types()
    _emit(args, data, lambda: _print_page(
        {"types": [_type_row(t) for t in data["types"]]}, TYPE_COLUMNS))
    return EXIT_OK


def _type_row(declared: dict[str, Any]) -> dict[str, Any]:
    """A declared type in one line: its newest schema's fields (`*` marks the required ones;
    `any` when it takes any payload), how many versions and workers declare it."""
    schema = declared.get("schema")
    if isinstance(schema, dict):
        required = set(schema.get("required", []))
        fields = [f"{name}*" if name in required else name
                  for name in schema.get("properties", {})]
    else:
        fields = ["any"]
    return {**declared, "fields": fields, "versions": len(declared.get("schemas", [])),
            "worker_count": len(declared.get("workers", []))}


@client_command
def cmd_queues(args: argparse.Namespace, client: Client) -> int:
    data = client.queues()
    while data.get("next_cursor"):  # every queue, a page at a time
        more = client.queues(cursor=data["next_cursor"])
        data = {**more, "queues": data["queues"] + more["queues"]}
    _emit(args, data, lambda: _print_queues(data))
    return EXIT_OK


def _print_queues(data: dict[str, Any]) -> None:
    """The queue table, then the dispatch mode (where workers take jobs from)."""
    _print_page(data, QUEUE_COLUMNS)
    dispatch = data.get("dispatch")
    if isinstance(dispatch, dict):
        note = {"postgres": " (Redis unreachable: workers claim from PostgreSQL, slower)",
                "rebuilding": " (Redis not rebuilt yet: workers that lost it claim from "
                              "PostgreSQL)"}.get(dispatch.get("mode"), "")
        print(f"dispatch: {dispatch.get('mode')}{note}")


@client_command
def cmd_limits_list(args: argparse.Namespace, client: Client) -> int:
    data = client.limits()
    _emit(args, data, lambda: _print_page(
        {"limits": [_limit_row(x) for x in data["limits"]]}, LIMIT_COLUMNS))
    return EXIT_OK


@client_command
def cmd_limits_set(args: argparse.Namespace, client: Client) -> int:
    rate, period = _rate_option(args.rate)
    limit = client.set_limit(args.scope, concurrency=args.concurrency, rate=rate,
                             period_s=period, per_key=args.per_key)
    _emit(args, limit, lambda: print(f"{limit['scope']}  {_describe_limit(limit)}"))
    return EXIT_OK


@client_command
def cmd_limits_delete(args: argparse.Namespace, client: Client) -> int:
    removed = client.delete_limit(args.scope)
    _emit(args, removed, lambda: print(f"{removed['scope']} removed; "
                                       f"{removed['released']} held jobs released"))
    return EXIT_OK


@client_command
def cmd_pause(args: argparse.Namespace, client: Client) -> int:
    state = client.pause_queue(args.queue)
    _emit(args, state, lambda: print(f"{state['name']} paused since {state['paused_at']}"))
    return EXIT_OK


@client_command
def cmd_resume(args: argparse.Namespace, client: Client) -> int:
    state = client.resume_queue(args.queue)
    _emit(args, state, lambda: print(f"{state['name']} resumed"))
    return EXIT_OK


@client_command
def cmd_audit(args: argparse.Namespace, client: Client) -> int:
    page = client.audit(actor=args.actor, action=args.action, limit=args.limit,
                        cursor=args.cursor)
    _emit(args, page, lambda: _print_page(page, AUDIT_COLUMNS))
    return EXIT_OK


@client_command
def cmd_whoami(args: argparse.Namespace, client: Client) -> int:
    who = client.whoami()
    _emit(args, who, lambda: print(f"{who.get('name') or '(anonymous)'}  {who.get('kind')}  "
                                   + " ".join(who.get("scopes") or ["(no scope)"])))
    return EXIT_OK


# -- argument values -------------------------------------------------------------------------

def _payload(text: str | None) -> Any:
    """--payload: JSON text, `@path` for a file, or `-` for standard input."""
    if text is None:
        return None
    source = text
    try:
        if text == "-":
            source = sys.stdin.read()
        elif text.startswith("@"):
            source = Path(text[1:]).read_text(encoding="utf-8")
        return json.loads(source)
    except OSError as err:
        raise UsageError(f"--payload: cannot read {text[1:]!r}: {err.strerror}") from None
    except ValueError as err:
        raise UsageError(f"--payload is not valid JSON: {err}") from None


def _priority(text: str | None) -> int | str | None:
    if text is None:
        return None
    return int(text) if text.lstrip("-").isdigit() else text


# -- output ----------------------------------------------------------------------------------

JOB_FIELDS = ("id", "type", "queue", "status", "priority", "payload", "attempts",
              "max_retries", "timeout_s", "next_run_at", "created_at", "updated_at",
              "last_error", "result", "lease", "unique_key", "debounce")
EVENT_COLUMNS = (("AT", "created_at"), ("ATTEMPT", "attempt"), ("EVENT", "event"),
                 ("WORKER", "worker_id"), ("ACTOR", "actor"), ("DETAIL", "detail"))
DLQ_COLUMNS = (("ID", "job.id"), ("TYPE", "job.type"), ("QUEUE", "job.queue"),
               ("ATTEMPTS", "attempts"), ("FAILED AT", "failed_at"), ("ERROR", "final_error"))
WORKER_COLUMNS = (("ID", "id"), ("HOST", "hostname"), ("PID", "pid"), ("QUEUES", "queues"),
                  ("CONCURRENCY", "concurrency"), ("ACTIVE", "active_jobs"),
                  ("HEARTBEAT AGE S", "heartbeat_age_s"), ("METRICS PORT", "metrics_port"),
                  ("CPUS", "cpus"), ("STARTED", "started_at"))
TYPE_COLUMNS = (("TYPE", "type"), ("QUEUE", "queue"), ("FIELDS", "fields"),
                ("VERSIONS", "versions"), ("WORKERS", "worker_count"), ("LAST SEEN", "last_seen"))
QUEUE_COLUMNS = (("QUEUE", "name"), ("PAUSED", "paused"), ("SCHEDULED", "counts.scheduled"),
                 ("QUEUED", "counts.queued"), ("RETRYING", "counts.retrying"),
                 ("RUNNING", "counts.running"), ("DEAD", "counts.dead"),
                 ("REDIS READY", "redis.ready_total"), ("REDIS PROCESSING", "redis.processing"))
LIMIT_COLUMNS = (("SCOPE", "scope"), ("LIMITS", "limits"), ("RUNNING", "running"),
                 ("STARTED", "started"), ("HELD", "held"))
DLQ_GROUP_COLUMNS = (("FINGERPRINT", "fingerprint"), ("COUNT", "count"), ("TYPES", "types"),
                     ("QUEUES", "queues"), ("FIRST SEEN", "first_seen"),
                     ("LAST SEEN", "last_seen"), ("SAMPLE ERROR", "sample_error"))
AUDIT_COLUMNS = (("AT", "at"), ("ACTOR", "actor"), ("ACTION", "action"), ("TARGET", "target"),
                 ("DETAIL", "detail"))
SCHEDULE_COLUMNS = (("NAME", "name"), ("CRON", "cron"), ("TIMEZONE", "timezone"),
                    ("TYPE", "job.type"), ("QUEUE", "job.queue"), ("PAUSED", "paused"),
                    ("NEXT RUN", "next_run"), ("LAST SLOT", "last_slot"),
                    ("LAST JOB", "last_job_id"), ("IN CODE", "declared_in_code"))


def _emit(args: argparse.Namespace, data: Any, readable: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        readable()


def cell(value: Any, width: int = CELL_CHARS) -> str:
    """One table cell: '-' for nothing, lists joined, objects as compact JSON, one line."""
    if value is None or value == "":
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    elif isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        text = ",".join(str(v) for v in value)
    elif isinstance(value, dict | list):
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Rows aligned under their headers, two spaces between columns."""
    cells = [[header for header, _ in columns]]
    cells += [[cell(lookup(row, key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def lookup(row: Any, path: str) -> Any:
    """`row["job"]["id"]` for the path "job.id"; None where any step is missing."""
    for step in path.split("."):
        if not isinstance(row, dict):
            return None
        row = row.get(step)
    return row


def items_of(data: Any) -> list[dict[str, Any]]:
    """The rows of a list answer: the answer itself, or its one list of objects."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for value in data.values():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                return value
    return []


def _print_page(data: Any, columns: Sequence[tuple[str, str]]) -> None:
    rows = items_of(data)
    print(table(rows, columns) if rows else "(none)")
    cursor = data.get("next_cursor") if isinstance(data, dict) else None
    if cursor:
        print(f"more: --cursor {cursor}")


def _print_job(job: dict[str, Any], *, events: bool) -> None:
    shown = [(name, job[name]) for name in JOB_FIELDS if name in job]
    width = max((len(name) for name, _ in shown), default=0)
    for name, value in shown:
        print(f"{name.ljust(width)}  {cell(value, 200)}")
    if events and job.get("events"):
        print()
        print(table(job["events"], EVENT_COLUMNS))


# -- parser ----------------------------------------------------------------------------------

def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("TASKLINE_URL") or DEFAULT_URL,
                        help="API base URL (default $TASKLINE_URL or %(default)s)")
    common.add_argument("--token", default=os.environ.get("TASKLINE_TOKEN") or None,
                        help="bearer token (default $TASKLINE_TOKEN)")
    common.add_argument("--http-timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for each API answer (default 10)")
    common.add_argument("--json", action="store_true", help="print the API's JSON")
    return common


def _enqueue_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("enqueue", parents=[common], help="enqueue a job")
    p.add_argument("type", help="job type (the handler's name)")
    p.add_argument("--payload", help="JSON payload, @FILE, or - for stdin (default {})")
    p.add_argument("--queue", help="queue (default: default)")
    p.add_argument("--priority", help="0..9 or low/normal/high/critical (default normal)")
    p.add_argument("--max-retries", type=int, help="retries after the first attempt")
    p.add_argument("--timeout", type=float, metavar="S", help="handler timeout, seconds")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="S", help="first run in S seconds")
    when.add_argument("--run-at", metavar="TIME", help="first run at an ISO 8601 time")
    p.add_argument("--idempotency-key", metavar="K",
                   help="dedupe key (default: a fresh one per command)")
    p.add_argument("--limit-key", metavar="K",
                   help="the budget it draws from under a per_key flow limit (e.g. a tenant)")
    _unique_arguments(p, "return the queue's job already holding the unique key (default "
                         "key: the type and payload) instead of enqueueing another")
    p.add_argument("--replace", action="store_true",
                   help="replace the payload, priority and run time of the unique key's job "
                        "if it has not started (409 if it has)")
    p.add_argument("--debounce-key", metavar="K",
                   help="join the job of this key (and type and queue) still waiting out its "
                        "delay; it runs once with every payload")
    p.add_argument("--debounce-delay", type=float, metavar="S",
                   help="run S seconds after the last arrival (at most 10 x S after the first)")
    p.add_argument("--ordering-key", metavar="K",
                   help="jobs of the queue with this key start one at a time, in enqueue order")
    expiry = p.add_mutually_exclusive_group()
    expiry.add_argument("--expires-at", metavar="TIME",
                        help="never started after this RFC 3339 time: cancelled (lapsed)")
    expiry.add_argument("--start-within", type=float, metavar="S",
                        help="never started more than S seconds from now: cancelled (lapsed)")
    p.add_argument("--tag", action="append", metavar="T",
                   help="a label to find the job by (GET /api/v1/jobs?tag=); repeatable, up to 20")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job to finish; exit 1 unless it succeeded")
    p.add_argument("--wait-timeout", type=float, default=60.0, metavar="S",
                   help="how long --wait waits (default 60)")
    p.set_defaults(fn=cmd_enqueue)


def _unique_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--unique and its options (`enqueue`, `schedule set`)."""
    p.add_argument("--unique", action="store_true", help=what)
    p.add_argument("--unique-key", metavar="K", help="the unique key (implies --unique)")
    p.add_argument("--unique-period", type=float, metavar="S",
                   help="only jobs created in the last S seconds count (default: for ever)")
    p.add_argument("--unique-states", metavar="STATES",
                   help="comma-separated states that count (default: every unfinished one)")


def _dlq_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    dlq = sub.add_parser("dlq", help="dead-lettered jobs")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    listing = dlq_sub.add_parser("list", parents=[common], help="list dead-lettered jobs")
    listing.add_argument("--queue", help="only this queue")
    listing.add_argument("--limit", type=int, help="at most N jobs")
    listing.add_argument("--cursor", help="continue after a previous page")
    listing.set_defaults(fn=cmd_dlq_list)
    groups = dlq_sub.add_parser("groups", parents=[common],
                                help="dead jobs grouped by the cause of their final error")
    groups.add_argument("--queue", help="only this queue")
    groups.add_argument("--limit", type=int, help="at most N groups (default 50)")
    groups.set_defaults(fn=cmd_dlq_groups)
    retry = dlq_sub.add_parser("retry", parents=[common],
                               help="requeue a dead-lettered job, or every one matching filters")
    retry.add_argument("id", nargs="?", type=entity_id,
                       help="job id (without filters: just this job)")
    _bulk_options(retry)
    retry.set_defaults(fn=cmd_dlq_retry)
    purge = dlq_sub.add_parser("purge", parents=[common],
                               help="delete dead-lettered jobs matching filters, with history")
    _bulk_options(purge)
    purge.set_defaults(fn=cmd_dlq_purge)


def _bulk_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--type", help="only jobs of this type")
    p.add_argument("--id", dest="ids", action="append", metavar="ID", type=entity_id,
                   help="only this job (repeatable)")
    p.add_argument("--fingerprint", help="only the jobs of this cause (taskline dlq groups)")
    p.add_argument("--limit", type=int, help="at most N jobs per call (1..10000, default 10000)")


def _schedules_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    schedules = sub.add_parser("schedules", help="periodic jobs")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    listing = schedules_sub.add_parser("list", parents=[common],
                                       help="schedules with their next run and last job")
    listing.add_argument("--limit", type=int, help="at most N schedules")
    listing.add_argument("--cursor", help="continue after a previous page")
    listing.set_defaults(fn=cmd_schedules_list)
    put = schedules_sub.add_parser("set", parents=[common], help="create or replace a schedule")
    put.add_argument("name", help="1..200 of A-Z a-z 0-9 _ . : -")
    put.add_argument("cron", help='cron expression, e.g. "*/5 * * * *" (quote it)')
    put.add_argument("type", help="job type of each slot's job")
    put.add_argument("--payload", help="JSON payload, @FILE, or - for stdin (default {})")
    put.add_argument("--queue", help="queue (default: default)")
    put.add_argument("--priority", help="0..9 or low/normal/high/critical (default normal)")
    put.add_argument("--max-retries", type=int, help="retries after the first attempt")
    put.add_argument("--timeout", type=float, metavar="S", help="handler timeout, seconds")
    put.add_argument("--timezone", help="IANA time zone the cron is read in (default UTC)")
    put.add_argument("--paused", action=argparse.BooleanOptionalAction, default=None,
                     help="paused: no slot fires (default: not paused)")
    put.add_argument("--catch-up", choices=("latest", "none"),
                     help="after downtime run the latest missed slot once (default) or none")
    _unique_arguments(put, "a slot whose unique key a job still holds fires no job "
                           "(default key: the type and payload)")
    put.set_defaults(fn=cmd_schedules_set)
    delete = schedules_sub.add_parser("delete", parents=[common], help="remove a schedule")
    delete.add_argument("name")
    delete.set_defaults(fn=cmd_schedules_delete)


def _audit_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    audit = sub.add_parser("audit", parents=[common],
                           help="the audit trail of operator actions (needs jobs:operate)")
    audit.add_argument("--actor", help="only this token name or JWT sub")
    audit.add_argument("--action", help="only this action, e.g. job.cancel")
    audit.add_argument("--limit", type=int, help="at most N records")
    audit.add_argument("--cursor", help="continue after a previous page")
    audit.set_defaults(fn=cmd_audit)
    add_verify_command(audit)
    sub.add_parser("whoami", parents=[common],
                   help="the name and scopes of the token").set_defaults(fn=cmd_whoami)


def _limit_row(limit: dict[str, Any]) -> dict[str, Any]:
    return {**limit, "limits": _describe_limit(limit)}


def _describe_limit(limit: dict[str, Any]) -> str:
    parts = []
    if limit.get("concurrency") is not None:
        parts.append(f"concurrency {limit['concurrency']}")
    if limit.get("rate"):
        parts.append(f"rate {limit['rate']['limit']}/{limit['rate']['period_s']:g}s")
    if limit.get("per_key"):
        parts.append("per key")
    return ", ".join(parts)


def _rate_option(text: str | None) -> tuple[int | None, float | None]:
    """`N/S` (N starts per S seconds) from --rate; a usage error otherwise."""
    if text is None:
        return None, None
    count, _, period = text.partition("/")
    try:
        return int(count), float(period or "1")
    except ValueError:
        raise UsageError(f"--rate takes N/SECONDS (e.g. 100/1), not {text!r}") from None


def _limits_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    limits = sub.add_parser("limits", help="cluster-wide rate and concurrency limits")
    limits_sub = limits.add_subparsers(dest="limits_command", required=True)
    limits_sub.add_parser("list", parents=[common],
                          help="every limit with its use").set_defaults(fn=cmd_limits_list)
    put = limits_sub.add_parser("set", parents=[common],
                                help="create or replace a scope's limits")
    put.add_argument("scope", help="type:<type> or queue:<queue>")
    put.add_argument("--concurrency", type=int, metavar="N", help="at most N running at once")
    put.add_argument("--rate", metavar="N/S", help="at most N starts in any S seconds")
    put.add_argument("--per-key", action="store_true",
                     help="one budget per job limit_key (fairness between tenants)")
    put.set_defaults(fn=cmd_limits_set)
    delete = limits_sub.add_parser("delete", parents=[common], help="remove a scope's limits")
    delete.add_argument("scope", help="type:<type> or queue:<queue>")
    delete.set_defaults(fn=cmd_limits_delete)


def _pause_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    pause = sub.add_parser("pause", parents=[common],
                           help="pause a queue: workers start none of its jobs until resumed")
    pause.add_argument("queue", help="queue name")
    pause.set_defaults(fn=cmd_pause)
    resume = sub.add_parser("resume", parents=[common], help="resume a paused queue")
    resume.add_argument("queue", help="queue name")
    resume.set_defaults(fn=cmd_resume)


def add_client_commands(sub: argparse._SubParsersAction) -> None:
    """Register the client commands on the `taskline` parser's subcommands."""
    common = _connection_options()
    _enqueue_parser(sub, common)
    status = sub.add_parser("status", parents=[common], help="show a job and its history")
    status.add_argument("id", type=entity_id, help="job id")
    status.set_defaults(fn=cmd_status)
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a job")
    cancel.add_argument("id", type=entity_id, help="job id")
    cancel.set_defaults(fn=cmd_cancel)
    _dlq_parser(sub, common)
    sub.add_parser("workers", parents=[common], help="live workers").set_defaults(fn=cmd_workers)
    sub.add_parser("queues", parents=[common], help="depth per queue").set_defaults(fn=cmd_queues)
    sub.add_parser("types", parents=[common],
                   help="job types the workers declared, with their payload fields "
                        "(--json: each version's JSON Schema)").set_defaults(fn=cmd_types)
    _pause_parsers(sub, common)
    _limits_parser(sub, common)
    _audit_parser(sub, common)
    _schedules_parser(sub, common)
