"""`taskline audit verify`: the audit of the recorded history, beside the `taskline audit`
listing of operator actions.

Invariant: it reads PostgreSQL only (DATABASE_URL, TASKLINE_SCHEMA), never the API or Redis,
and writes nothing; it prints one line per violation (or, with --json, one document) and exits
0 when the history holds none, 1 when it holds any, 2 when it could not audit (a bad --since,
PostgreSQL unreachable, DATABASE_URL not a PostgreSQL URL).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from taskline.settings import Settings

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_UNAUDITED = 0, 1, 2
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_value(text: str) -> datetime:
    """An ISO 8601 instant (UTC when it names no offset), or a span back from now: 90s, 30m,
    24h, 7d."""
    ago = _AGO.fullmatch(text.strip())
    if ago:
        return datetime.now(UTC) - timedelta(seconds=float(ago[1]) * _UNIT_S[ago[2]])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor a span such as 30m, 24h or 7d") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    from taskline.audit_verify import verify
    from taskline.errors import StoreUnavailable
    from taskline.store.history import HistoryReader
    from taskline.store.store import make_engine

    try:
        engine = make_engine(settings.database_url, pool_size=1, max_overflow=0,
                             application_name="taskline-audit")
    except ValueError as err:  # not a PostgreSQL URL
        print(f"taskline audit verify: {err}", file=sys.stderr)
        return EXIT_UNAUDITED
    stats: dict[str, int] = {}
    found = []
    try:
        for violation in verify(HistoryReader(engine, settings.schema), args.since,
                                stats=stats):
            found.append(violation)
            if not args.json:
                print(violation.line(), flush=True)
    except StoreUnavailable as err:
        print(f"taskline audit verify: {err}", file=sys.stderr)
        return EXIT_UNAUDITED
    finally:
        engine.dispose()
    _summary(args, stats, found)
    return EXIT_VIOLATIONS if found else EXIT_CLEAN


def _summary(args: argparse.Namespace, stats: dict[str, int], found: list[Any]) -> None:
    if args.json:
        print(json.dumps({"ok": not found, "since": args.since and args.since.isoformat(),
                          **stats, "violations": [v.as_dict() for v in found]}, indent=2))
    else:
        print(f"{'ok' if not found else 'FAILED'}: {stats.get('jobs', 0)} jobs and "
              f"{stats.get('limit_settings', 0)} flow limit settings checked, "
              f"{len(found)} violations")


def add_verify_command(audit: argparse.ArgumentParser) -> None:
    """`verify` under the `audit` command, which without it still lists operator actions."""
    sub = audit.add_subparsers(dest="audit_command", required=False)
    verify = sub.add_parser(
        "verify", help="check the recorded history against taskline's invariants "
                       "(reads DATABASE_URL; exit 1 on any violation)")
    verify.add_argument("--since", type=since_value, default=None, metavar="T",
                        help="only jobs created since T (ISO 8601, or a span: 30m, 24h, 7d)")
    verify.add_argument("--json", action="store_true", help="one JSON document for machines")
    verify.set_defaults(fn=cmd_audit_verify)
