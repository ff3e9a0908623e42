"""taskline maintenance: the leader-elected service that repairs what failures broke.

Components (one module each, River style): `leader` (only one instance acts), `reaper`
(expired leases), `promoter` (due retries and delayed jobs), `reconciler` (Redis vs
PostgreSQL), `depths` (queue-depth gauges); `loop` runs them, `main` wires them together.
"""
