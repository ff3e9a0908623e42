"""The private PostgreSQL and Redis servers of `taskline dev`, under the command line's name: they
live in the library (taskline.localservers) because the pytest plugin's `taskline_db` starts one
too, and the library never imports the command line."""

from taskline.localservers import (
    DEBIAN_BINDIRS,
    LOOPBACK,
    PrivatePostgres,
    PrivateRedis,
    PrivateServer,
    ServerError,
    free_port,
    group_alive,
    port_free,
    postgres_bindir,
    redis_answers,
    redis_binary,
)

__all__ = ["DEBIAN_BINDIRS", "LOOPBACK", "PrivatePostgres", "PrivateRedis", "PrivateServer",
           "ServerError", "free_port", "group_alive", "port_free", "postgres_bindir",
           "redis_answers", "redis_binary"]
