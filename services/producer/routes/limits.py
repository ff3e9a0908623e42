"""Flow limits: PUT, GET and DELETE /api/v1/limits[/{scope}].

Invariant: a limit is a row of `flow_limits` (scope `type:<type>` or `queue:<queue>`); every
worker reads the set within a second and starts a job a limit applies to only through the
budgeted claim (taskline_worker.held), so a limit binds the whole cluster, not one process.
Bad input is a 4xx that changes nothing. Removing a limit hands the jobs it held back to Redis
(in order, most urgent first), as they would have been dispatched without it
(taskline_producer.operations.flowlimits).
"""

from __future__ import annotations

import math

from flask import Blueprint, Response, jsonify, request

from taskline import flow
from taskline_producer.operations import flowlimits
from taskline_producer.operations.backends import backends
from taskline_producer.schemas import shapes
from taskline_producer.schemas.body import read_json
from taskline_producer.schemas.errors import InvalidParameter, NotFound, ValidationFailed

bp = Blueprint("limits", __name__, url_prefix="/api/v1")

FIELDS = frozenset({"concurrency", "rate", "per_key"})


@bp.put("/limits/<path:scope>")
def put_limit(scope: str) -> Response:
    _check_scope(scope)
    limit = parse_limit(scope, read_json(request, backends().settings.max_payload_bytes))
    row = flowlimits.put(scope, limit)
    response = jsonify(shapes.flow_limit(row))
    response.status_code = 201 if row["created"] else 200
    return response


@bp.get("/limits")
def list_limits() -> Response:
    rows = flowlimits.listed()
    return jsonify({"limits": [{**shapes.flow_limit(r), "running": r["running"],
                                "started": r["started"], "held": r["held"]} for r in rows]})


@bp.delete("/limits/<path:scope>")
def delete_limit(scope: str) -> Response:
    _check_scope(scope)
    removed = flowlimits.remove(scope)
    if removed is None:
        raise NotFound("no limit has this scope", {"scope": scope})
    row, released = removed
    return jsonify({**shapes.flow_limit(row), "released": released})


def parse_limit(scope: str, body: object) -> flow.Limit:
    """The limit a PUT body describes, or ValidationFailed naming every bad field."""
    if not isinstance(body, dict):
        raise ValidationFailed(details=[{"field": "$", "message": "must be a JSON object"}])
    errors = [{"field": name, "message": "unknown field"} for name in body if name not in FIELDS]
    concurrency = _number(body, "concurrency", errors)
    rate_limit, period_s = _rate(body.get("rate"), errors)
    per_key = body.get("per_key", False)
    if not isinstance(per_key, bool):
        errors.append({"field": "per_key", "message": "must be true or false"})
    if concurrency is None and rate_limit is None and not errors:
        errors.append({"field": "$", "message": "give concurrency, rate, or both"})
    if errors:
        raise ValidationFailed(details=errors)
    return flow.Limit(scope, concurrency, rate_limit, period_s, per_key)


def _check_scope(scope: str) -> None:
    try:
        flow.parse_scope(scope)
    except ValueError as err:
        raise InvalidParameter(str(err), {"parameter": "scope"}) from None


def _number(body: dict, name: str, errors: list[dict]) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= flow.MAX_NUMBER:
        errors.append({"field": name, "message": f"must be an integer 1..{flow.MAX_NUMBER}"})
        return None
    return value


def _rate(rate: object, errors: list[dict]) -> tuple[int | None, float | None]:
    if rate is None:
        return None, None
    if not isinstance(rate, dict):
        errors.append({"field": "rate", "message": 'must be {"limit": n, "period_s": s}'})
        return None, None
    errors += [{"field": f"rate.{k}", "message": "unknown field"} for k in rate
               if k not in ("limit", "period_s")]
    limit = _number(rate, "limit", errors)
    if rate.get("limit") is None:
        errors.append({"field": "rate.limit", "message": "required: an integer "
                                                         f"1..{flow.MAX_NUMBER}"})
    period = rate.get("period_s")
    if (isinstance(period, bool) or not isinstance(period, int | float)
            or not math.isfinite(period) or not 0 < period <= flow.MAX_PERIOD_S):
        errors.append({"field": "rate.period_s",
                       "message": f"required: seconds, > 0 and <= {flow.MAX_PERIOD_S:g}"})
        return None, None
    if limit is None:
        return None, None
    return limit, float(period)
