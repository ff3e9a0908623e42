"""A fresh database on the development PostgreSQL, migrated by the running virtualenv's taskline:
what the scripts that time single statements (claim_plans.py, queue_count.py) start from."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

ADMIN_URL = os.environ.get("BENCH_ADMIN_URL", "postgresql://root@127.0.0.1:5432/postgres")


def url_of(name: str) -> str:
    """The URL of database `name` on ADMIN_URL's server."""
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def fresh_database(name: str) -> str:
    """Drop and create database `name`, migrate it to this checkout's schema; its URL."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    subprocess.run([sys.executable, "-m", "taskline_cli.main", "migrate"], check=True,
                   env={**os.environ, "DATABASE_URL": url_of(name)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return url_of(name)
