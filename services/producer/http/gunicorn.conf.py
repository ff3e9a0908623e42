"""gunicorn settings of the producer API; `serve.run` loads them and adds bind and workers.

Invariant: each worker process builds its own app (no preload), so no pool connection crosses
a fork; prometheus-client's multiprocess files of a worker that exits are marked dead so its
live gauges disappear and its counters still add up. Event streams never take more than half
of a worker's threads and end when the worker is told to stop.
"""

# gthread: threads keep a slow PostgreSQL round trip from idling a process. An event stream
# (/api/v1/events) holds a thread for as long as its browser stays, so streams may take at most
# half of them (post_worker_init below); the other half always serves ordinary requests.
# It accepts by least connections (taskline_producer.http.balancer): all processes share
# one listening socket, and one holding more connections than a live sibling leaves a new
# connection to it. With a socket per process (SO_REUSEPORT) the kernel placed connections by
# a hash, blind to load: two keep-alive clients landed on one process in half the runs, which
# then served both under one GIL while the other idled (docs/performance.md).
# Requests are read on each process's event loop, with deadlines, and handed to a thread only
# once whole (taskline_producer.http.intake): a slow or silent client holds no thread.
worker_class = "taskline_producer.http.intake.IntakeWorker"
threads = 16
# Open connections per process, slow ones included (each costs a descriptor and a buffer, not a
# thread); past it the process stops accepting until some close.
worker_connections = 4000
preload_app = False
reuse_port = False
# Seconds a silent worker may block before the master replaces it; above the 10 s pool timeout.
timeout = 30
# SIGTERM lets in-flight requests finish within this many seconds.
graceful_timeout = 20
keepalive = 5
# Access logging is off: the request metrics count every request by route and status.
accesslog = None
errorlog = "-"
# gunicorn's messages go to the root logger, formatted like every other line of the service.
logger_class = "taskline_producer.http.serve.ServiceLogger"
loglevel = "info"
proc_name = "taskline-api"
# No control socket: its default path is per user, so two APIs on one host would share it.
control_socket_disable = True
# Bounds of the request line and headers (bodies are bounded by TASKLINE_MAX_PAYLOAD_BYTES).
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190


def on_starting(server):
    from taskline_producer.http.balancer import share_table

    share_table(server)


def pre_fork(server, worker):
    from taskline_producer.http.balancer import assign_slot

    assign_slot(server, worker)


def post_worker_init(worker):
    # worker.wsgi is this process's Flask app; its signal handlers are installed by now.
    from taskline import heap
    from taskline_producer.routes.events import adopt_gunicorn_worker

    adopt_gunicorn_worker(worker.wsgi, worker.cfg.threads)
    heap.settle_after_start()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    from taskline_producer.http.balancer import free_slot

    multiprocess.mark_process_dead(worker.pid)
    free_slot(server, worker)
