"""Workflow commands of the `taskline` CLI: `taskline workflow submit FILE.json | status ID |
cancel ID`.

Invariant: as every client command, they talk to the API only through `taskline.client.Client`,
print a readable table (or, with --json, the API's JSON unchanged) and exit 0 on success, 1
when the API refused or could not be reached, 2 on a usage error (an unreadable FILE).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from taskline.client import Client
from taskline_cli.clientcmds import (
    EXIT_OK,
    UsageError,
    _connection_options,
    _emit,
    client_command,
    entity_id,
    table,
)

STEP_COLUMNS = (("STEP", "id"), ("STATUS", "state"), ("AFTER", "after"), ("WHEN", "when"),
                ("TYPE", "type"), ("ATTEMPTS", "attempts"), ("JOB", "job_id"),
                ("LAST ERROR", "last_error"))


def _definition(path: str) -> dict[str, Any]:
    """FILE.json (or - for standard input): `{"name": ..., "steps": [...]}`."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read a workflow from {path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise UsageError(f"{path} must hold a JSON object with name and steps")
    return data


def _print_workflow(wf: dict[str, Any]) -> None:
    print(f"{wf.get('id')}  {wf.get('name')}  {wf.get('status')}")
    print(table([{**s, "state": _state(s)} for s in wf.get("steps") or []], STEP_COLUMNS))


def _state(step: dict[str, Any]) -> str:
    """A step's status, with why it was cancelled (`cancelled (condition_unmet)`) when known."""
    cause = step.get("cancel_cause")
    return f"{step.get('status')} ({cause})" if cause else str(step.get("status"))


@client_command
def cmd_workflow_submit(args: argparse.Namespace, client: Client) -> int:
    data = _definition(args.file)
    wf = client.submit_workflow(str(data.get("name") or Path(args.file).stem), data["steps"],
                                idempotency_key=args.idempotency_key
                                or data.get("idempotency_key"))
    _emit(args, wf, lambda: _print_workflow(wf))
    return EXIT_OK


@client_command
def cmd_workflow_status(args: argparse.Namespace, client: Client) -> int:
    wf = client.workflow(args.id)
    while wf.get("next_cursor"):  # every step, a page at a time
        more = client.workflow(args.id, cursor=wf["next_cursor"])
        wf = {**more, "steps": wf["steps"] + more["steps"]}
    _emit(args, wf, lambda: _print_workflow(wf))
    return EXIT_OK


@client_command
def cmd_workflow_cancel(args: argparse.Namespace, client: Client) -> int:
    wf = client.cancel_workflow(args.id)
    _emit(args, wf, lambda: _print_workflow(wf))
    return EXIT_OK


def add_workflow_commands(sub: argparse._SubParsersAction) -> None:
    """Register `taskline workflow ...` on the `taskline` parser's subcommands."""
    common = _connection_options()
    workflow = sub.add_parser("workflow", help="workflows of dependent jobs")
    wf_sub = workflow.add_subparsers(dest="workflow_command", required=True)
    submit = wf_sub.add_parser("submit", parents=[common],
                               help="submit a workflow from FILE.json (- for stdin)")
    submit.add_argument("file", metavar="FILE.json")
    submit.add_argument("--idempotency-key", metavar="K",
                        help="dedupe key (default: the file's, else a fresh one)")
    submit.set_defaults(fn=cmd_workflow_submit)
    status = wf_sub.add_parser("status", parents=[common], help="a workflow and its steps")
    status.add_argument("id", type=entity_id, help="workflow id")
    status.set_defaults(fn=cmd_workflow_status)
    cancel = wf_sub.add_parser("cancel", parents=[common],
                               help="cancel every unfinished step of a workflow")
    cancel.add_argument("id", type=entity_id, help="workflow id")
    cancel.set_defaults(fn=cmd_workflow_cancel)
