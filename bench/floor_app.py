"""The HTTP floor: a Flask app that does nothing but what every API request must do.

It reads the JSON body and answers 201 with a small JSON object, served by gunicorn with the
producer API's worker class, thread count, sockets and connection balancing
(bench/scenarios.http_floor).
Whatever rate it reaches on a machine is the most any Flask route under that gunicorn can
serve there, so the single-enqueue figures are read against it (docs/performance.md).
"""

from __future__ import annotations

from flask import Flask, jsonify, request

from taskline import heap

app = Flask(__name__)


@app.get("/readyz")
def ready() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/api/v1/jobs")
def accept() -> tuple:
    body = request.get_json()
    return jsonify({"id": "00000000-0000-7000-8000-000000000000", "type": body["type"],
                    "status": "queued"}), 201


# gunicorn imports this module in each worker (no preload), where the API freezes its start-up
# objects once its app is built (gunicorn.conf.py); the floor does the same, so the two differ
# only in what the route does.
heap.settle_after_start()
