"""The API's use cases: what a route asks for (enqueue, cancel, bulk dead-letter moves...), done
against the store and the dispatcher, with its metrics, log line and audit record, returning a
result the route shapes. Also the per-process backends they run on.
"""
