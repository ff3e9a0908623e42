"""taskline: a fault-tolerant distributed job engine; this package is the common library.

PostgreSQL is the source of truth and Redis only dispatches ids. Handlers register with
`@handler("type")`; producers talk to the API, or use `Client`.
"""

from taskline.errors import NonRetryableError, RetryableError
from taskline.handlers.registry import handler

__all__ = ["NonRetryableError", "RetryableError", "handler"]
