"""Private PostgreSQL and Redis servers on loopback, for `taskline dev`, the tests and
the pytest plugin's `taskline_db` (taskline.testing.database).

A private server is a child process started here in a session of its own, so its process
group is its PID: every signal this module sends goes to that PID or that group, never to a
process found by name. PostgreSQL refuses to run as root, so under root the server's directory
belongs to the `postgres` OS user and the server runs as that user.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg import sql
from redis.backoff import NoBackoff
from redis.retry import Retry

from taskline.errors import TasklineError

LOOPBACK = "127.0.0.1"


class ServerError(TasklineError):
    """A private server could not be prepared or started."""


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """True when no server listens on `port` (connections of an earlier one may linger)."""
    with socket.socket() as sock:
        # Servers bind with SO_REUSEADDR, so TIME_WAIT leftovers must not count as "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """True when the Redis at `url` answers PING within `timeout` seconds (no retries)."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


# Where distributions put PostgreSQL's server programs off PATH (Debian and Ubuntu).
DEBIAN_BINDIRS = ("/usr/lib/postgresql/*/bin",)


def postgres_bindir(search: tuple[str, ...] = DEBIAN_BINDIRS) -> Path | None:
    """Where `initdb` and `postgres` live: pg_config, then the globs in `search`, then PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(out.stdout.strip()))
    found = [d for pattern in search for d in glob.glob(pattern)]
    candidates += [Path(d) for d in sorted(found, key=_major_version, reverse=True)]
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "postgres").is_file() and (bindir / "initdb").is_file():
            return bindir
    return None


def _major_version(bindir: str) -> int:
    name = Path(bindir).parent.name
    return int(name) if name.isdigit() else 0


def redis_binary() -> Path | None:
    found = shutil.which("redis-server")
    return Path(found) if found else None


def group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` is still running (zombies do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


class PrivateServer:
    """One server process started by this object; subclasses say how to run and probe it."""

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, workdir: Path, port: int | None = None, log_path: Path | None = None):
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self._port_fixed = port is not None
        self.log_path = Path(log_path) if log_path else self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- what a subclass defines ---------------------------------------------------------
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _run_as(self) -> dict[str, Any]:
        return {}

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Start and wait until the server answers; an auto-chosen port is retried if taken."""
        if self.running:
            return
        attempts = 1 if self._port_fixed else 3
        for attempt in range(attempts):
            if attempt:
                self.port = free_port()
            self._spawn()
            if self._wait_ready(timeout):
                self._port_fixed = True  # restarts keep the URL the caller already holds
                return
        raise ServerError(f"{self.name} did not start on port {self.port}:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop; SIGKILL if it takes longer than `timeout`."""
        if not self.running:
            return
        self.thaw()
        self._signal(self.stop_signal)
        try:
            self.proc.wait(timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()
        self._wait_group_gone()

    def kill(self) -> None:
        """SIGKILL the server's main process, then wait until every process it had is gone."""
        if not self.running:
            return
        self._signal(signal.SIGKILL)
        self._signal_group(signal.SIGCONT)  # frozen backends must run to notice and exit
        self.proc.wait()  # type: ignore[union-attr]
        self._wait_group_gone()

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    def freeze(self) -> None:
        """SIGSTOP every process of the server: it holds its connections and answers nothing."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)

    def close(self) -> None:
        """Tear down quickly (tests): thaw, kill the whole group, wait for it."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._wait_group_gone()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        return "\n".join(text.splitlines()[-lines:])

    # -- mechanics -----------------------------------------------------------------------
    def _spawn(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, **self._run_as())

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if self._ready():
                return True
            if time.monotonic() > deadline:
                self.close()
                return False
            time.sleep(0.05)
        self._wait_group_gone()
        return False

    def _signal(self, sig: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)  # type: ignore[union-attr]

    def _signal_group(self, sig: int) -> None:
        # Only while the leader is unreaped (alive or a zombie): until then its PID, which is
        # the group id, cannot have been reused.
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def _wait_group_gone(self, timeout: float = 15.0) -> None:
        """Backends outlive a killed postmaster briefly; a restart must wait for them."""
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout
        while group_alive(self.proc.pid):
            if time.monotonic() > deadline:
                raise ServerError(f"processes of {self.name} (group {self.proc.pid}) linger")
            time.sleep(0.05)


class PrivateRedis(PrivateServer):
    """A Redis that keeps nothing on disk: a restart comes back empty."""

    name = "redis"

    def __init__(self, workdir: Path, port: int | None = None, log_path: Path | None = None,
                 binary: Path | None = None):
        super().__init__(workdir, port, log_path)
        found = binary or redis_binary()
        if found is None:
            raise ServerError("redis-server is not installed")
        self.binary = found

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def _argv(self) -> list[str]:
        return [str(self.binary), "--port", str(self.port), "--bind", LOOPBACK,
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--daemonize", "no", "--maxmemory-policy", "noeviction"]

    def _ready(self) -> bool:
        return redis_answers(self.url)

    def flushall(self) -> None:
        with redis.Redis.from_url(self.url, socket_timeout=5) as client:
            client.flushall()


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster in `workdir/data`, TCP on loopback only, trust authentication.

    `fast` turns fsync off: committed data survives a server crash (the OS keeps the pages)
    but not a machine crash, which is the trade tests want. Commits stay synchronous, so a
    crash test can rely on every committed row.
    """

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back sessions, checkpoint, exit

    def __init__(self, workdir: Path, port: int | None = None, log_path: Path | None = None, *,
                 superuser: str | None = None, fast: bool = False, bindir: Path | None = None):
        super().__init__(workdir, port, log_path)
        found = bindir or postgres_bindir()
        if found is None:
            raise ServerError("the PostgreSQL server programs (initdb, postgres) are not installed")
        self.bindir = found
        self.data_dir = self.workdir / "data"
        self.superuser = superuser or getpass.getuser()
        self.fast = fast
        self._account = _server_account()

    def url(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.superuser}@{LOOPBACK}:{self.port}/{dbname}"

    @property
    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def init(self, template: Path | None = None) -> bool:
        """Create the cluster (initdb, or a copy of `template`) unless it exists; True if made."""
        if self.initialised:
            return False
        self._prepare_workdir()
        if template is not None:
            shutil.copytree(template, self.data_dir, symlinks=True)
            self._chown_tree(self.data_dir)
            return True
        argv = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.superuser,
                "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]
        with open(self.log_path, "ab") as log:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, check=False, **self._run_as())
        if done.returncode != 0:
            raise ServerError(f"initdb failed in {self.data_dir}:\n{self.log_tail()}")
        return True

    def crash(self) -> None:
        """SIGKILL the postmaster (no shutdown checkpoint); returns once its backends are gone."""
        self.kill()

    def ensure_role(self, name: str) -> None:
        """A login superuser `name` (a URL may name a user other than the bootstrap one)."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE ROLE {} SUPERUSER LOGIN").format(sql.Identifier(name)))

    def adopt_leftover(self) -> int | None:
        """Use a server an earlier run left running on this data directory, if it answers.

        Returns its PID; `port` and `url()` then point at it. It stays unowned: stop(),
        kill() and freeze() act only on a process this object started.
        """
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        previous, self.port = self.port, port
        if not self._ready():
            self.port = previous
            return None
        return pid

    def _argv(self) -> list[str]:
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", f"listen_addresses={LOOPBACK}", "-c", "unix_socket_directories="]
        if self.fast:
            argv += ["-c", "fsync=off", "-c", "full_page_writes=off"]
        return argv

    def _ready(self) -> bool:
        try:
            psycopg.connect(self.url(), connect_timeout=2).close()
        except psycopg.Error:
            return False
        return True

    def _run_as(self) -> dict[str, Any]:
        if self._account is None:
            return {}
        return {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}

    def _prepare_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._account is None:
            return
        os.chown(self.workdir, self._account.pw_uid, self._account.pw_gid)
        os.chmod(self.workdir, 0o700)
        _check_reachable(self.workdir.parent, self._account)

    def _chown_tree(self, root: Path) -> None:
        if self._account is None:
            return
        uid, gid = self._account.pw_uid, self._account.pw_gid
        os.chown(root, uid, gid)
        for parent, dirs, files in os.walk(root):
            for name in dirs + files:
                os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def _server_account() -> pwd.struct_passwd | None:
    """The OS account PostgreSQL runs as: `postgres` under root (it refuses root), else us."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError("PostgreSQL refuses to run as root and there is no `postgres` OS "
                          "user to run it as") from None


def _check_reachable(path: Path, account: pwd.struct_passwd) -> None:
    """Fail clearly when the postgres OS user cannot enter `path` (e.g. a checkout in /root)."""
    for folder in (path, *path.parents):
        st = folder.stat()
        if st.st_uid == account.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid == account.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise ServerError(f"the `postgres` OS user cannot enter {folder}, so a private "
                              "PostgreSQL cannot live below it; run as a normal user or move "
                              "the folder")
