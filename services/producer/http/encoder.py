"""The API's JSON encoder: Flask's JSON provider, with orjson writing the response bodies.

Invariant: a body holds the values, in the key order, that Flask's own provider would write;
only its bytes may differ (non-ASCII characters arrive as UTF-8 instead of \\u escapes). What
orjson cannot write the way Flask does is left to Flask's provider: datetimes and dataclasses
go to Flask's `default`, and a body with an integer past 64 bits or a non-string key is written
by Flask's provider whole. A large batch response costs a small fraction of the CPU Flask's
own encoder takes (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import orjson
from flask import Response
from flask.json.provider import DefaultJSONProvider

_OPTIONS = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
            | orjson.OPT_APPEND_NEWLINE)


class ResponseEncoder(DefaultJSONProvider):
    """DefaultJSONProvider whose compact, unsorted responses orjson writes."""

    def response(self, *args: Any, **kwargs: Any) -> Response:
        pretty = self.compact is False or (self.compact is None and self._app.debug)
        if pretty or self.sort_keys:
            return super().response(*args, **kwargs)
        obj = self._prepare_response_obj(args, kwargs)
        try:
            body = orjson.dumps(obj, default=self.default, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: a big integer, a non-string key
            return super().response(*args, **kwargs)
        return self._app.response_class(body, mimetype=self.mimetype)
