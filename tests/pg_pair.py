"""A PostgreSQL primary and a synchronous streaming standby on loopback, to fail over.

Built from Debian's PostgreSQL binaries (``/usr/lib/postgresql/<n>/bin``, the
highest version there): ``initdb`` for the primary, ``pg_basebackup -R`` for
the standby, both started with ``pg_ctl`` on free ports in a temporary folder.
The primary names the standby in ``synchronous_standby_names``, so a commit
returns only once the standby has the WAL: promoting the standby loses no
acknowledged commit.

PostgreSQL refuses to run as root. As root, every binary runs through
``runuser -u postgres`` (the ``postgres`` OS user of Debian's package) in a
folder owned by that user; as anyone else, as the current user.

fsync is off on both servers (a test's speed; an immediate stop keeps what
the OS holds, so nothing acknowledged is lost by it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from shoal.db.embedded import free_port

SERVER_USER = "postgres"
STANDBY_NAME = "standby1"
TIMEOUT_S = 60


def debian_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<n>/bin`` holding pg_basebackup, if any."""
    found = [
        path
        for path in Path("/usr/lib/postgresql").glob("*/bin")
        if (path / "pg_basebackup").exists() and path.parent.name.isdigit()
    ]
    return max(found, key=lambda p: int(p.parent.name)) if found else None


class PgNode:
    """One server of the pair: its data directory and port."""

    def __init__(self, pair: PgPair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.data_dir = pair.base_dir / name
        self.port = free_port()

    @property
    def log_path(self) -> Path:
        return self.pair.base_dir / f"{self.name}.log"

    def start(self) -> None:
        self.pair.run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(TIMEOUT_S),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-o",
            f"-p {self.port}",
        )

    def stop(self, mode: str = "fast") -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.pair.run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data_dir), check=False)

    def promote(self) -> None:
        """Make this standby a primary; returns once it accepts writes (``pg_ctl promote -w``)."""
        self.pair.run("pg_ctl", "promote", "-w", "-t", str(TIMEOUT_S), "-D", str(self.data_dir))

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


class PgPair:
    """A primary and its synchronous standby, in a temporary folder removed by :meth:`close`."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.as_root = os.geteuid() == 0
        self.base_dir = Path(tempfile.mkdtemp(prefix="shoal-failover-"))
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base_dir, user.pw_uid, user.pw_gid)
        self.primary = PgNode(self, "primary")
        self.standby = PgNode(self, "standby")

    def run(self, program: str, *args: str, check: bool = True) -> str:
        command = [str(self.bin_dir / program), *args]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(
            command,
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            # pg_ctl's server keeps inherited pipes open; -l sends its output
            # elsewhere, and stdin must not be ours either.
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT_S + 30,
        )
        if check and result.returncode != 0:
            tails = f"\n{self.primary.log_tail()}\n{self.standby.log_tail()}"
            raise RuntimeError(
                f"{program} {' '.join(args[:2])} failed: {result.stderr.strip()}{tails}"
            )
        return result.stdout

    def url(self, node: PgNode, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={node.port} user=postgres dbname={dbname}"

    def multi_host_url(self, dbname: str) -> str:
        """Both servers, the writable one chosen at each connect: what clients are given."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
            f"user=postgres dbname={dbname} target_session_attrs=read-write"
        )

    def start(self) -> PgPair:
        primary, standby = self.primary, self.standby
        self.run(
            "initdb",
            "-D",
            str(primary.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-instructions",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.base_dir}'",
            "max_connections": "200",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "hot_standby": "on",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_standby_names": f"'{STANDBY_NAME}'",
            "synchronous_commit": "on",
        }
        self._append_conf(primary, settings)
        primary.start()
        self.run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(standby.data_dir),
            "-X",
            "stream",
            "--checkpoint=fast",
            "-R",
        )
        # -R wrote primary_conninfo without a name; the primary waits for STANDBY_NAME.
        # The copied postgresql.conf names a synchronous standby too: once
        # promoted, the standby would have none, and every commit would wait
        # for it forever. It gets none, as an operator's failover tooling
        # sets it (docs/deploying.md).
        self._append_conf(
            standby,
            {
                "primary_conninfo": (
                    f"'host=127.0.0.1 port={primary.port} user=postgres "
                    f"application_name={STANDBY_NAME}'"
                ),
                "synchronous_standby_names": "''",
            },
            auto=True,
        )
        standby.start()
        self.wait_synchronous()
        return self

    def wait_synchronous(self) -> None:
        """Return once the primary reports the standby as its synchronous one."""
        deadline = time.monotonic() + TIMEOUT_S
        with psycopg.connect(self.url(self.primary), autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
                if row is not None and row[0] == "sync":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not synchronous: {row}")
                time.sleep(0.05)  # noqa: TID251 - a blocking set-up step, bounded above

    def _append_conf(self, node: PgNode, settings: dict[str, str], *, auto: bool = False) -> None:
        path = node.data_dir / ("postgresql.auto.conf" if auto else "postgresql.conf")
        with path.open("a") as conf:
            conf.write("".join(f"{key} = {value}\n" for key, value in settings.items()))

    def close(self) -> None:
        for node in (self.standby, self.primary):
            node.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)
