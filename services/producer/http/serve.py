"""Runs the producer API under gunicorn, programmatically (`taskline api`).

Invariant: PROMETHEUS_MULTIPROC_DIR is set, and emptied, before any worker starts and before
prometheus-client is imported here, so every process writes its samples where /metrics merges
them; each worker builds its app, and with it its own pools, after the fork.
"""

from __future__ import annotations

import os
import runpy
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger

from taskline import tracing
from taskline.settings import Settings

CONFIG_FILE = Path(__file__).with_name("gunicorn.conf.py")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class ServiceLogger(Logger):
    """gunicorn's own records go through the service's log set-up (JSON lines or text), so
    every line the API writes has one format; gunicorn keeps deciding their level."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            logger.handlers.clear()
            logger.propagate = True


class ProducerServer(BaseApplication):
    """gunicorn with settings from gunicorn.conf.py plus `options`, serving create_app(settings)."""

    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings and value is not None:
                self.cfg.set(key, value)

    def load(self) -> Any:
        # Runs in each worker after the fork: the app, and its pools, belong to that process.
        from taskline_producer.app import create_app

        tracing.setup("api", self.settings)
        return create_app(self.settings, binds=self.cfg.bind)


def gunicorn_options(bind: str, workers: int) -> dict[str, Any]:
    """The settings of gunicorn.conf.py with `bind` and `workers` applied."""
    namespace = runpy.run_path(str(CONFIG_FILE))
    options = {k: v for k, v in namespace.items() if not k.startswith("_")}
    options.update(bind=[bind], workers=max(int(workers), 1))
    return options


def prepare_metrics_dir() -> tuple[Path, bool]:
    """Empty (or create) the multiprocess metrics directory; stale files would double-count.

    Returns the directory and whether it was created here (then `run` removes it at exit).
    """
    given = os.environ.get(MULTIPROC_ENV)
    path = Path(given or tempfile.mkdtemp(prefix="taskline-api-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for entry in path.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path, not given


def run(settings: Settings, bind: str = "0.0.0.0:8000", workers: int = 2) -> int:
    """Serve until SIGTERM or SIGINT; returns gunicorn's exit status."""
    metrics_dir, created = prepare_metrics_dir()
    master = os.getpid()
    server = ProducerServer(settings, gunicorn_options(bind, workers))
    try:
        server.run()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        # A gunicorn worker is a fork of this call and leaves through it too (its SystemExit
        # passes here): only the master may remove the folder, which other workers still use.
        if created and os.getpid() == master:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
