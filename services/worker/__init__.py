"""taskline worker: pulls job ids from Redis, claims them in PostgreSQL under a lease, runs their
handlers and records one fenced outcome per attempt. `main.run` is the entry point of
`taskline worker`; `worker.Worker` wires the parts together and can run in-process (tests)."""
