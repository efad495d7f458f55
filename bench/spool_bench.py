"""The producer's spool, two ways in one run: SQLite in WAL mode, and the segment files before it.

``python -m bench.spool_bench`` spools N observations (10,000) into each
spool from a producer process, with one put at a time and with many at once
(``--concurrency 1,64``), then:

- **spooling**: puts per second, the producer's CPU per put
  (``time.process_time``, its threads included) and the bytes on disk;
- **handing on**: the first half removed in batches of 200, as the
  pipeline's replayer does;
- **the crash**: the producer goes on putting new messages and is SIGKILLed
  once 50 more were confirmed; a torn write (part of a record, part of a log
  frame) is then appended to the newest file, as a crash in the middle of a
  write leaves it on a machine that lost power;
- **recovery**: a new ``Spool.open()`` on the directory (wall time, CPU),
  then every waiting message handed on in batches of 200, and a last open
  that must find the spool empty.

It checks what the spool promises: every confirmed put not yet removed is
replayed, each exactly once; nothing removed comes back; any message beyond
those is one whose put was in flight at the kill (at most the concurrency).
It exits 1 if a check fails.

The segment spool is ``shoal/ingest/spool.py`` as it was at ``--baseline-rev``
(read with ``git show``): CRC-32-framed records in append-only segments
under a flock. The SQLite spool is the tree's ``shoal.ingest.spool``. No
database server is involved. The header's fsync rate (200-byte appends, each
fsynced, for 2 s) bounds one-at-a-time puts as the commit rate bounds the
other benches.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import itertools
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shoal.clock import SystemClock
from shoal.ingest.message import new_envelope

ROOT = Path(__file__).resolve().parent.parent
# The last commit whose shoal/ingest/spool.py is the segment spool.
BASELINE_REV = "087af55c7a944bb5fed8992dd27f02e5db9e54c4"
IMPLS = ("segments", "sqlite")
REPLAY_BATCH = 200  # shoal.ingest.pipeline.REPLAY_BATCH
TAIL_CONFIRMED = 50  # puts confirmed after the removals, before the kill
FSYNC_PROBE_S = 2.0


def load_spool(impl: str, baseline_rev: str) -> types.ModuleType:
    """The spool module of ``impl``: the tree's, or the baseline's source from git."""
    if impl == "sqlite":
        import shoal.ingest.spool as tree

        return tree
    source = subprocess.run(
        ["git", "show", f"{baseline_rev}:shoal/ingest/spool.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("bench_segment_spool", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{baseline_rev[:7]}:shoal/ingest/spool.py", "exec"), module.__dict__)
    return module


def observation(i: int) -> dict[str, Any]:
    """A body the size of a polling observation (about 300 bytes of JSON)."""
    return {
        "observation_id": f"obs-{i:08d}",
        "card_id": f"card-{i % 5000:06d}",
        "account_id": f"acct-{i % 97:04d}",
        "kind": "traffic",
        "observed_at": "2026-12-07T00:00:00+00:00",
        "used_kb": 1024 + i,
        "status": None,
        "raw": "x" * 120,
        "priority_item_id": None,
    }


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def fsync_rate(directory: Path, seconds: float = FSYNC_PROBE_S) -> float:
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            os.write(fd, b"x" * 200)
            os.fsync(fd)
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


# -- the producer process -----------------------------------------------------


async def produce(impl: str, directory: Path, n: int, concurrency: int, baseline_rev: str) -> None:
    """Spool n, remove half, then put until killed; reports on stdout, one line each."""
    module = load_spool(impl, baseline_rev)
    clock = SystemClock()
    spool = await module.Spool(directory, clock=clock).open()
    counter = itertools.count()

    async def put(message_id: str, i: int) -> None:
        envelope = new_envelope(observation(i), published_at=clock.now(), id=message_id)
        await spool.put("readings", envelope, mode=None, reason="both down", rounds=3)

    async def putter() -> None:
        while (i := next(counter)) < n:
            await put(f"m{i}", i)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(putter() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"put {wall:.6f} {cpu:.6f} {disk_bytes(directory)}", flush=True)

    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, n // 2, REPLAY_BATCH):
        await spool.remove([f"m{i}" for i in range(start, min(start + REPLAY_BATCH, n // 2))])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"removed {wall:.6f} {cpu:.6f} {disk_bytes(directory)}", flush=True)

    tail = itertools.count()

    async def tail_putter() -> None:
        while True:
            i = next(tail)
            await put(f"t{i}", n + i)
            print(f"acked t{i}", flush=True)

    await asyncio.gather(*(tail_putter() for _ in range(concurrency)))


# -- the parent ---------------------------------------------------------------


def tree_rev() -> str:
    return subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


@dataclass
class Case:
    impl: str
    concurrency: int
    n: int
    round: int
    put_s: float = 0.0
    put_cpu_s: float = 0.0
    bytes_spooled: int = 0
    remove_s: float = 0.0
    remove_cpu_s: float = 0.0
    bytes_at_kill: int = 0
    files_at_kill: list[str] = field(default_factory=list)
    recover_s: float = 0.0
    recover_cpu_s: float = 0.0
    replay_s: float = 0.0
    recovered: int = 0
    expected: int = 0
    missing: int = 0
    duplicates: int = 0
    resurrected: int = 0
    in_flight: int = 0
    replayed_once: bool = False
    empty_after: bool = False
    bytes_after: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.missing == 0
            and self.duplicates == 0
            and self.resurrected == 0
            and self.in_flight <= self.concurrency
            and self.replayed_once
            and self.empty_after
        )


def tear(impl: str, directory: Path, module: types.ModuleType) -> None:
    """Append part of a write to the newest file, as a crash mid-write leaves it."""
    if impl == "segments":
        newest = max(directory.glob("spool-*.log"))
        with newest.open("ab") as f:
            f.write(module.HEADER.pack(module.MAGIC, 300, 0) + b'{"op":"put","topic":"rea')
        return
    wal = directory / "spool.db-wal"
    data = wal.read_bytes()
    with wal.open("ab") as f:
        f.write(data[32 : 32 + 24 + 300])  # a frame's header, then part of its page


async def run_case(
    impl: str,
    n: int,
    concurrency: int,
    round_: int,
    base: Path,
    baseline_rev: str,
    module: types.ModuleType,
) -> Case:
    case = Case(impl, concurrency, n, round_)
    directory = base / f"{impl}-c{concurrency}-r{round_}"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.spool_bench",
        "--child",
        impl,
        "--dir",
        str(directory),
        "--n",
        str(n),
        "--concurrency",
        str(concurrency),
        "--baseline-rev",
        baseline_rev,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    acked: set[str] = set()
    try:
        put = (await child.stdout.readline()).split()
        case.put_s, case.put_cpu_s, case.bytes_spooled = float(put[1]), float(put[2]), int(put[3])
        halved = (await child.stdout.readline()).split()
        case.remove_s, case.remove_cpu_s = float(halved[1]), float(halved[2])
        while len(acked) < TAIL_CONFIRMED:
            line = await child.stdout.readline()
            if not line:
                raise RuntimeError(f"{impl}: the producer ended early")
            acked.add(line.split()[1].decode())
        os.kill(child.pid, signal.SIGKILL)  # puts in flight: only the disk remains
        await child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    # Lines the producer wrote before the kill that were not read yet are confirmations too.
    for line in (await child.stdout.read()).splitlines():
        if line.startswith(b"acked "):
            acked.add(line.split()[1].decode())
    tear(impl, directory, module)
    case.bytes_at_kill = disk_bytes(directory)
    case.files_at_kill = sorted(p.name for p in directory.iterdir())

    clock = SystemClock()
    cpu, wall = time.process_time(), time.perf_counter()
    spool = await module.Spool(directory, clock=clock).open()
    case.recover_s, case.recover_cpu_s = time.perf_counter() - wall, time.process_time() - cpu

    ids = [e.envelope.id for e in spool.entries()]
    waiting = {f"m{i}" for i in range(n // 2, n)} | acked
    removed = {f"m{i}" for i in range(n // 2)}
    case.recovered, case.expected = len(ids), len(waiting)
    case.duplicates = len(ids) - len(set(ids))
    case.missing = len(waiting - set(ids))
    case.resurrected = len(removed & set(ids))
    case.in_flight = len(set(ids) - waiting - removed)

    handed: collections.Counter[str] = collections.Counter()
    wall = time.perf_counter()
    while batch := spool.entries(REPLAY_BATCH):
        batch_ids = [e.envelope.id for e in batch]
        handed.update(batch_ids)
        await spool.remove(batch_ids)
    case.replay_s = time.perf_counter() - wall
    await spool.close()
    case.replayed_once = set(handed) == set(ids) and all(c == 1 for c in handed.values())
    again = await module.Spool(directory, clock=clock).open()
    case.empty_after = len(again) == 0
    await again.close()
    case.bytes_after = disk_bytes(directory)
    return case


def report(cases: list[Case], header: list[str]) -> str:
    out = list(header)
    base = {(c.round, c.concurrency): c for c in cases if c.impl == "segments"}

    def rate(c: Case) -> float:
        return c.n / c.put_s

    def cpu_us(c: Case) -> float:
        return c.put_cpu_s / c.n * 1e6

    out.append("")
    out.append(
        "Spooling N observations (median over the rounds; ratios against the segment spool "
        "of the same round, median and range):"
    )
    out.append("")
    out.append(
        "| spool | puts at once | puts/s | vs segments | producer CPU us/put | vs segments "
        "| bytes on disk after N puts | open after the kill, s |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted({(c.concurrency, c.impl) for c in cases}, key=lambda k: (k[0], IMPLS.index(k[1])))
    for concurrency, impl in keys:
        mine = [c for c in cases if (c.concurrency, c.impl) == (concurrency, impl)]
        rates = [rate(c) / rate(base[(c.round, concurrency)]) for c in mine]
        cpus = [cpu_us(c) / cpu_us(base[(c.round, concurrency)]) for c in mine]
        out.append(
            f"| {impl} | {concurrency} | {statistics.median(rate(c) for c in mine):,.0f} "
            f"| {statistics.median(rates):.2f}x ({min(rates):.2f}-{max(rates):.2f}) "
            f"| {statistics.median(cpu_us(c) for c in mine):,.0f} "
            f"| {statistics.median(cpus):.2f}x ({min(cpus):.2f}-{max(cpus):.2f}) "
            f"| {statistics.median(c.bytes_spooled for c in mine):,.0f} "
            f"| {statistics.median(c.recover_s for c in mine):.3f} |"
        )
    out.append("")
    out.append("Every run:")
    out.append("")
    out.append(
        "| round | spool | puts at once | puts/s | CPU us/put | bytes after N puts "
        "| remove N/2 s | files at the kill (torn write appended) | bytes | open s | open CPU s "
        "| waiting: expected / found | missing | twice | removed, back | in flight "
        "| replay s | each once | empty after | bytes after |"
    )
    out.append(
        "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"
    )
    for c in cases:
        out.append(
            f"| {c.round} | {c.impl} | {c.concurrency} | {rate(c):,.0f} | {cpu_us(c):,.0f} "
            f"| {c.bytes_spooled:,} | {c.remove_s:.3f} | {', '.join(c.files_at_kill)} "
            f"| {c.bytes_at_kill:,} | {c.recover_s:.3f} | {c.recover_cpu_s:.3f} "
            f"| {c.expected:,} / {c.recovered:,} | {c.missing} | {c.duplicates} "
            f"| {c.resurrected} | {c.in_flight} | {c.replay_s:.3f} "
            f"| {'yes' if c.replayed_once else 'NO'} | {'yes' if c.empty_after else 'NO'} "
            f"| {c.bytes_after:,} |"
        )
    out.append("")
    out.append(
        "waiting: the confirmed puts not removed (N/2 plus the tail confirmed before the kill); "
        "in flight: found, though never confirmed (a put under way at the kill; at most the "
        "puts at once). Each once: every waiting message handed on by one remove, none twice. "
        "Open: Spool.open() on the killed producer's directory, SQLite's recovery or the "
        "segments' scan included."
    )
    return "\n".join(out)


async def main(args: argparse.Namespace) -> int:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=args.dir) as tmp:
        base = Path(tmp)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        rev = tree_rev()
        header = [
            f"N = {args.n:,} observations; puts at once: {args.concurrency}; "
            f"rounds: {args.rounds}; "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            f"machine: os.cpu_count() = {os.cpu_count()}; load average {load}; "
            f"fsync rate {fsync_rate(base):,.0f}/s (200-byte appends, each fsynced, "
            f"{FSYNC_PROBE_S:.0f} s, in {base.parent})",
            f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}; shoal at {rev}; "
            f"segments: shoal/ingest/spool.py at {args.baseline_rev[:7]}",
        ]
        print("\n".join(header), flush=True)
        modules = {impl: load_spool(impl, args.baseline_rev) for impl in IMPLS}
        cases = []
        for round_, concurrency in itertools.product(range(1, args.rounds + 1), concurrencies):
            # Turn about: which spool goes first alternates from round to round.
            for impl in IMPLS if round_ % 2 else IMPLS[::-1]:
                case = await run_case(
                    impl, args.n, concurrency, round_, base, args.baseline_rev, modules[impl]
                )
                print(
                    f"  round {round_}, {impl} x{concurrency}: "
                    f"{case.n / case.put_s:,.0f} puts/s, "
                    f"open after the kill {case.recover_s:.3f} s, "
                    f"{'ok' if case.ok else 'CHECK FAILED'}",
                    flush=True,
                )
                cases.append(case)
    print()
    print(report(cases, header))
    failed = [c for c in cases if not c.ok]
    for c in failed:
        print(f"CHECK FAILED: {c.impl} x{c.concurrency}: {c}", file=sys.stderr)
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="observations to spool (10,000)")
    parser.add_argument(
        "--concurrency", default="1,64", help="puts at once, comma-separated (1,64)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, spools taking turns (3)")
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="the segment spool's commit")
    parser.add_argument("--dir", default=None, help="where the spools go (a temporary directory)")
    parser.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    if arguments.child:
        asyncio.run(
            produce(
                arguments.child,
                Path(arguments.dir),
                arguments.n,
                int(arguments.concurrency),
                arguments.baseline_rev,
            )
        )
    else:
        sys.exit(asyncio.run(main(arguments)))
