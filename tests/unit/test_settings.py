"""Settings: parsing from the environment, defaults, and the cross-field rules."""

from __future__ import annotations

import pytest

from taskline.errors import ConfigError
from taskline.settings import Settings, env_names


def test_defaults_are_the_documented_ones():
    s = Settings.from_env(env={})
    assert (s.lease_s, s.heartbeat_s, s.reaper_interval_s, s.reconcile_interval_s) == (
        15, 5, 5, 30)
    assert (s.backoff_base_s, s.backoff_factor, s.backoff_max_s) == (10, 4, 3600)
    assert s.max_payload_bytes == 1_048_576 and s.api_tokens == ()
    assert s.shutdown_grace_s == 30 and s.metrics_port == 9100
    assert s.renew_every_s == 5 and s.schema == "taskline"
    assert Settings.from_env(env={"TASKLINE_SCHEMA": "jobs_2"}).schema == "jobs_2"


def test_environment_is_parsed_with_fractions_and_lists():
    s = Settings.from_env(env={
        "DATABASE_URL": "postgresql://db/x", "TASKLINE_LEASE_S": "0.6",
        "TASKLINE_HEARTBEAT_S": "0.2", "TASKLINE_API_TOKENS": "a, b,,",
        "TASKLINE_HANDLERS": "mod.one,mod.two", "TASKLINE_METRICS_PORT": "0",
    })
    assert s.database_url == "postgresql://db/x" and s.lease_s == 0.6
    assert s.api_tokens == ("a", "b") and s.handlers == ("mod.one", "mod.two")
    assert s.metrics_port == 0


def test_allowed_hosts_are_names_ip_literals_or_a_star():
    s = Settings.from_env(env={"TASKLINE_ALLOWED_HOSTS": "api, taskline.example.com.,10.0.0.1,"
                                                         "[::1],taskline_api,*"})
    assert s.allowed_hosts == ("api", "taskline.example.com.", "10.0.0.1", "[::1]",
                               "taskline_api", "*")
    assert Settings.from_env(env={}).allowed_hosts == ()


@pytest.mark.parametrize(("env", "message"), [
    ({"TASKLINE_LEASE_S": "abc"}, "TASKLINE_LEASE_S"),
    ({"TASKLINE_HEARTBEAT_S": "20"}, "HEARTBEAT"),
    ({"TASKLINE_BACKOFF_FACTOR": "0.5"}, "FACTOR"),
    ({"TASKLINE_BACKOFF_MAX_S": "1"}, "BACKOFF_MAX"),
    ({"TASKLINE_LOG_FORMAT": "xml"}, "LOG_FORMAT"),
    ({"TASKLINE_METRICS_PORT": "70000"}, "METRICS_PORT"),
    ({"TASKLINE_ALLOWED_HOSTS": "api,http://taskline.example"}, "ALLOWED_HOSTS"),
    ({"TASKLINE_ALLOWED_HOSTS": "taskline.example:8000"}, "ALLOWED_HOSTS"),
    ({"TASKLINE_SCHEMA": "Taskline"}, "TASKLINE_SCHEMA"),
    ({"TASKLINE_SCHEMA": "task-line"}, "TASKLINE_SCHEMA"),
    ({"TASKLINE_SCHEMA": "taskline; DROP TABLE x"}, "TASKLINE_SCHEMA"),
    ({"TASKLINE_SCHEMA": "pg_jobs"}, "TASKLINE_SCHEMA"),
    ({"TASKLINE_SCHEMA": "x" * 64}, "TASKLINE_SCHEMA"),
])
def test_invalid_values_fail_at_start_up_with_the_variable_named(env, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env=env)


def test_env_names_cover_the_documented_variables():
    names = set(env_names())
    assert {"DATABASE_URL", "REDIS_URL", "TASKLINE_LEASE_S", "TASKLINE_API_TOKENS",
            "TASKLINE_SHUTDOWN_GRACE_S", "TASKLINE_METRICS_PORT"} <= names


def test_retention_defaults_zero_and_bounds():
    s = Settings.from_env(env={})
    assert s.retention_s == {"succeeded": 604_800, "cancelled": 604_800, "dead": 2_592_000}
    assert s.retention_interval_s == 10 * s.reaper_interval_s
    # A short retention is pruned more often (a tenth of it), never more often than the reaper.
    short = Settings.from_env(env={"TASKLINE_RETAIN_SUCCEEDED_S": "60"})
    assert short.retention_interval_s == 6.0
    tiny = Settings.from_env(env={"TASKLINE_RETAIN_CANCELLED_S": "1"})
    assert tiny.retention_interval_s == tiny.reaper_interval_s
    none = Settings.from_env(env={f"TASKLINE_RETAIN_{s}_S": "0"
                                  for s in ("SUCCEEDED", "CANCELLED", "DEAD")})
    assert none.retention_interval_s == 10 * none.reaper_interval_s
    forever = Settings.from_env(env={"TASKLINE_RETAIN_DEAD_S": "0",
                                     "TASKLINE_RETAIN_SUCCEEDED_S": "0.5"})
    assert forever.retention_s["dead"] == 0 and forever.retention_s["succeeded"] == 0.5
    for name in ("TASKLINE_RETAIN_SUCCEEDED_S", "TASKLINE_RETAIN_CANCELLED_S",
                 "TASKLINE_RETAIN_DEAD_S"):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(env={name: "-1"})


def test_pooling_decides_where_a_session_is_found():
    direct = Settings.from_env(env={"DATABASE_URL": "postgresql://db/app"})
    assert not direct.transaction_pooled and direct.session_url == "postgresql://db/app"
    pooled = Settings.from_env(env={"DATABASE_URL": "postgresql://bouncer/app",
                                    "TASKLINE_DATABASE_POOLING": "transaction"})
    assert pooled.transaction_pooled and pooled.session_url is None
    both = pooled.replace(database_direct_url="postgresql://db/app")
    assert both.session_url == "postgresql://db/app"
    # The direct URL is for a pooled DATABASE_URL only: a session URL is DATABASE_URL itself.
    assert direct.replace(database_direct_url="postgresql://other/x").session_url == \
        "postgresql://db/app"
    with pytest.raises(ConfigError, match="TASKLINE_DATABASE_POOLING"):
        Settings.from_env(env={"TASKLINE_DATABASE_POOLING": "statement"})
