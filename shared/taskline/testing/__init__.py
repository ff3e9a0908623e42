"""Testing a team's jobs: run a handler, assert what was enqueued, drain the due jobs.

    from taskline.testing import assert_enqueued, drain, run_handler

`run_handler` calls one handler with a real context; `enqueued` / `assert_enqueued` read back the
jobs a test wrote through its connection; `drain` runs every due job through the worker's own
claim, lease and outcome code, without Redis. The pytest plugin (module taskline_pytest) gives
the `taskline_db` fixture. docs/testing.md, "Testing your jobs", shows each.
"""

from taskline.execution.runner import BadResult, NoHandler
from taskline.testing.drain import Drained, drain
from taskline.testing.enqueued import assert_enqueued, enqueued
from taskline.testing.handlers import run_handler

__all__ = ["BadResult", "Drained", "NoHandler", "assert_enqueued", "drain", "enqueued",
           "run_handler"]
