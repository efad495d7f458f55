"""Processes of the polling app's tests: the gateway as ``shoal-polling gateway``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shoal.db.embedded import free_port

REPO = Path(__file__).resolve().parents[2]


class GatewayProcess:
    """``shoal-polling gateway`` on a free port; stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, log_dir: Path, *flags: str) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"gateway-{self.port}.log"
        self.flags = flags
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shoal_polling.cli",
                    "gateway",
                    "--port",
                    str(self.port),
                    *list(self.flags),
                ],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
