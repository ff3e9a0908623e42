"""The operations dashboard: `/dashboard` and its two files, served by the API itself (`/`
leads there).

Invariant: the page loads nothing from anywhere else (no CDN, no build step: the files in
`static/` are served as they are) and holds no secret: it is open like /healthz, while every
API call and the event stream it makes carry the token the operator typed in. The Content
Security Policy allows only this origin, so the page can run no script it did not ship.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from flask import Blueprint, Response, redirect, request

bp = Blueprint("dashboard", __name__)

FILES = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    # A token in the event stream's URL must never travel to another site in a Referer.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _content(name: str) -> tuple[bytes, str]:
    """A packaged file and its ETag, read once per process."""
    data = resources.files("taskline_producer").joinpath("static", name).read_bytes()
    return data, hashlib.sha256(data).hexdigest()[:32]


def _serve(name: str) -> Response:
    data, etag = _content(name)
    response = Response(data, headers={"Content-Type": FILES[name], **SECURITY_HEADERS})
    response.set_etag(etag)
    return response.make_conditional(request)


@bp.get("/")
def root() -> Response:
    """The API's address opened in a browser (`make run` prints it) leads to the dashboard."""
    return redirect("/dashboard", code=302)


@bp.get("/dashboard")
def page() -> Response:
    return _serve("dashboard.html")


@bp.get("/dashboard/dashboard.js")
def script() -> Response:
    return _serve("dashboard.js")


@bp.get("/dashboard/dashboard.css")
def stylesheet() -> Response:
    return _serve("dashboard.css")
