"""The app factory (flaskr style): `create_app(settings)` builds a configured API.

Invariant: the app holds no connection when it is created; each process opens its own on first
use (see backends), so an app built before a fork is safe to serve after it. Every response is
JSON, Flask's routing errors included, except the Prometheus scrape, the dashboard's
files and the event stream.
"""

from __future__ import annotations

from collections.abc import Iterable

from flask import Flask

from taskline.dispatch.dispatcher import Dispatcher
from taskline.settings import Settings
from taskline.store.views import ApiStore
from taskline_producer.http import auth, listcache, origins, request_metrics, waiting
from taskline_producer.http.encoder import ResponseEncoder
from taskline_producer.operations.backends import Backends
from taskline_producer.routes import (
    apidoc,
    audit,
    bulkdlq,
    dashboard,
    events,
    health,
    inspection,
    jobs,
    jobtypes,
    limits,
    pauses,
    schedules,
    workflows,
)
from taskline_producer.schemas import errors


def create_app(settings: Settings | None = None, store: ApiStore | None = None,
               dispatcher: Dispatcher | None = None, binds: Iterable[str] = ()) -> Flask:
    """The producer API; `settings` default to the environment, `store`/`dispatcher` to new ones.

    `binds` are the addresses it is served on (gunicorn's `bind`): their host names are names
    the API answers to in a request's Host (taskline_producer.http.origins).
    """
    settings = settings or Settings.from_env()
    app = Flask(__name__, static_folder=None)
    app.config.update(
        TASKLINE_MAX_PAYLOAD_BYTES=settings.max_payload_bytes,
        # One byte over the limit: taskline_producer.schemas.body reads one byte past a body of
        # exactly the limit to learn that it ended, and Werkzeug refuses any read at its own
        # maximum. The limit itself is enforced there, in the error shape; this only bounds the
        # stream.
        MAX_CONTENT_LENGTH=settings.max_payload_bytes + 1,
        # Automatic OPTIONS answers are empty text/html; without them OPTIONS is a JSON 405.
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    app.json = ResponseEncoder(app)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # Werkzeug answers `//api/v1/jobs` with an HTML redirect; a JSON 404 is what clients parse.
    app.url_map.merge_slashes = False
    app.extensions["taskline"] = Backends(settings, store, dispatcher)
    request_metrics.init_app(app)
    origins.init_app(app, settings, binds)
    auth.init_app(app, settings)
    errors.init_app(app)
    events.init_app(app)
    waiting.init_app(app, settings)
    listcache.init_app(app, settings.api_list_cache_s)
    for blueprint in (jobs.bp, inspection.bp, health.bp, apidoc.bp, events.bp, dashboard.bp,
                      auth.bp, audit.bp, pauses.bp, limits.bp, schedules.bp, bulkdlq.bp,
                      workflows.bp, jobtypes.bp):
        app.register_blueprint(blueprint)
    return app


def close_app(app: Flask) -> None:
    """Release the connections the app opened in this process."""
    events.close_streams(app)
    waiting.close_waits(app)
    app.extensions["taskline"].close()
