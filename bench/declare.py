"""Records the benchmark's job types in PostgreSQL as a starting worker does, with
BENCH_DECLARED=1 their payload schemas: the API then checks declared payloads in the enqueue
scenarios, which run no worker. Run by bench/stack.py after each reset, with the stack's
environment (DATABASE_URL, PYTHONPATH holding bench/).
"""

from __future__ import annotations

import os

import benchjobs  # noqa: F401  (registers the handlers whose types are recorded)

from taskline.handlers import serving
from taskline.store.store import Store

TTL_S = 86_400.0

if __name__ == "__main__":
    store = Store.connect(os.environ["DATABASE_URL"], pool_size=1)
    try:
        store.declare_types("bench-declared", serving.served(), TTL_S)
    finally:
        store.dispose()
