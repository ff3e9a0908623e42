"""gunicorn settings of the producer API; `serve.run` loads them and adds bind and workers.

Invariant: each worker process builds its own app (no preload), so no pool connection crosses
a fork; prometheus-client's multiprocess files of a worker that exits are marked dead so its
live gauges disappear and its counters still add up.
"""

# gthread: a few threads per process keep a slow PostgreSQL round trip from idling a process.
worker_class = "gthread"
threads = 4
preload_app = False
# Seconds a silent worker may block before the master replaces it; above the 10 s pool timeout.
timeout = 30
# SIGTERM lets in-flight requests finish within this many seconds.
graceful_timeout = 20
keepalive = 5
# Access logging is off: the request metrics count every request by route and status.
accesslog = None
errorlog = "-"
loglevel = "info"
proc_name = "taskline-api"
# No control socket: its default path is per user, so two APIs on one host would share it.
control_socket_disable = True
# Bounds of the request line and headers (bodies are bounded by TASKLINE_MAX_PAYLOAD_BYTES).
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
