"""`taskline` console script: server commands (migrate, api, worker, maintenance, dev) and
client commands (enqueue, status, dlq, workers). Each service is imported only when its
command runs, so the client commands start fast and need no server dependencies.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from collections.abc import Sequence

from taskline import affinity, log, sched_policy
from taskline.errors import ConfigError
from taskline.settings import Settings


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from taskline.store.migrate import finish_move, upgrade
    # Its lock and search_path are a session's: never through a transaction pooler.
    url = settings.session_url
    if url is None:
        print("taskline: migrate needs a session of its own, which a transaction pooler does "
              "not keep: set TASKLINE_DATABASE_DIRECT_URL to PostgreSQL itself",
              file=sys.stderr)
        return 2
    upgrade(url, schema=settings.schema)
    print(f"schema {settings.schema} is at the newest revision")
    if args.finish_move:
        dropped = finish_move(url, settings.schema)
        print(f"dropped {len(dropped)} compatibility views in public")
    return 0


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    if not _api_installed("api"):
        return 2
    from taskline_producer.http.serve import run
    return run(settings, bind=args.bind, workers=args.workers)


def _api_installed(command: str) -> bool:
    """Whether the `api` extra (Flask, gunicorn) is installed; says how to get it if not."""
    missing = [m for m in ("flask", "gunicorn") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"taskline: `taskline {command}` serves the API, which needs "
              f"{' and '.join(missing)}: pip install 'taskline[api]'", file=sys.stderr)
    return not missing


def _cpus(value: str) -> str:
    if not affinity.valid(value):
        raise argparse.ArgumentTypeError("auto, none or a CPU list such as 0,2-3")
    return value


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from taskline_worker.main import run
    port = settings.metrics_port if args.metrics_port is None else args.metrics_port
    if args.handlers is not None:
        settings = dataclasses.replace(settings, handlers=tuple(args.handlers))
    if args.cpus is not None:
        settings = dataclasses.replace(settings, worker_cpus=args.cpus)
    if args.sched is not None:
        settings = dataclasses.replace(settings, worker_sched=args.sched)
    return run(settings, queues=args.queues, concurrency=args.concurrency, metrics_port=port,
               fallback=args.metrics_port is None)


def cmd_maintenance(args: argparse.Namespace, settings: Settings) -> int:
    from taskline_maintenance.main import run
    port = settings.metrics_port if args.metrics_port is None else args.metrics_port
    return run(settings, metrics_port=port, fallback=args.metrics_port is None)


METRICS_PORT_HELP = ("port of /metrics and /readyz (default TASKLINE_METRICS_PORT, 9100, or "
                     "the next free port when that one is taken; given, a taken port is an "
                     "error; 0 = off)")


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    if not _api_installed("dev"):
        return 2
    from taskline_cli.devstack import run_dev
    return run_dev(settings, api_bind=args.bind)


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from taskline import doctor
    plan = doctor.Plan(workers=args.workers, concurrency=args.concurrency,
                       api_processes=args.api_processes, maintenance=args.maintenance)
    checks = doctor.run_checks(settings, plan)
    if args.json:
        print(json.dumps({"ok": not doctor.failed(checks),
                          "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        width = max((len(check.name) for check in checks), default=0)
        for check in checks:
            print(check.line(width))
    return 1 if doctor.failed(checks) else 0


def _doctor_command(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser("doctor", help="check the servers and settings taskline runs on")
    doctor.add_argument("--json", action="store_true", help="one JSON document for machines")
    plan = doctor.add_argument_group("the deployment the connection check adds up")
    for flag, default, what in (("--workers", 1, "worker processes"),
                                ("--concurrency", 16, "each worker's --concurrency"),
                                ("--api-processes", 2, "API processes (all gunicorn workers)"),
                                ("--maintenance", 1, "maintenance processes")):
        plan.add_argument(flag, type=_count, default=default, help=f"{what} (default {default})")
    doctor.set_defaults(fn=cmd_doctor)


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a count (>= 0)")
    return number


def _server_commands(sub: argparse._SubParsersAction) -> None:
    migrate = sub.add_parser("migrate", help="create or upgrade the schema (TASKLINE_SCHEMA)")
    migrate.add_argument("--finish-move", action="store_true",
                         help="after moving out of public: drop the compatibility views there "
                              "(once no process of an earlier release runs)")
    migrate.set_defaults(fn=cmd_migrate)
    api = sub.add_parser("api", help="serve the producer API with gunicorn")
    api.add_argument("--bind", default="0.0.0.0:8000", help="HOST:PORT (default 0.0.0.0:8000)")
    api.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    api.set_defaults(fn=cmd_api)
    worker = sub.add_parser(
        "worker", help="run jobs",
        description="Run jobs of the handlers registered by the modules in TASKLINE_HANDLERS "
                    "(or --handlers), and of the built-in types (echo, simulate, webhook).")
    worker.add_argument("--queues", type=_csv, default=["default"],
                        help="comma-separated queues, taken in this order (default: default)")
    worker.add_argument("--concurrency", type=int, default=16,
                        help="handlers running at once, threads and async def coroutines "
                             "together (default 16: docs/performance.md, concurrency sweep)")
    worker.add_argument("--metrics-port", type=int, default=None, help=METRICS_PORT_HELP)
    worker.add_argument("--handlers", type=_csv, default=None, metavar="MOD1,MOD2",
                        help="comma-separated modules imported for their @handler "
                             "registrations (default TASKLINE_HANDLERS; given, it replaces it)")
    worker.add_argument("--cpus", type=_cpus, default=None, metavar="auto|none|LIST",
                        help="pin the process: auto (a CPU of its own per worker process of "
                             "the host while busy, free while idle), none (not pinned) or CPUs "
                             "such as 0,2-3 (default TASKLINE_WORKER_CPUS, else auto; "
                             "docs/deployment.md)")
    worker.add_argument("--sched", choices=sched_policy.POLICIES, default=None,
                        help="the kernel's scheduling policy of the process: batch (a thread "
                             "it wakes does not preempt its waker) or normal (default "
                             "TASKLINE_WORKER_SCHED, else batch; docs/deployment.md)")
    worker.set_defaults(fn=cmd_worker)
    maint = sub.add_parser("maintenance", help="reaper, promoter and reconciliation")
    maint.add_argument("--metrics-port", type=int, default=None, help=METRICS_PORT_HELP)
    maint.set_defaults(fn=cmd_maintenance)
    dev = sub.add_parser("dev", help="run api + worker + maintenance in the foreground")
    dev.add_argument("--bind", default="127.0.0.1:8000", help="API HOST:PORT")
    dev.set_defaults(fn=cmd_dev)
    _doctor_command(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskline", description="taskline job engine")
    sub = parser.add_subparsers(dest="command", required=True)
    _server_commands(sub)
    from taskline_cli.clientcmds import add_client_commands
    add_client_commands(sub)
    from taskline_cli.workflowcmds import add_workflow_commands
    add_workflow_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as err:
        print(f"taskline: {err}", file=sys.stderr)
        return 2
    if args.command not in ("dev", "doctor"):
        log.setup(args.command, settings.log_format, settings.log_level)
    return int(args.fn(args, settings) or 0)


if __name__ == "__main__":
    sys.exit(main())
