"""Every Python block of the README and of docs/ runs, so an example cannot rot.

The blocks of one page run in order in one namespace, as a reader reads them
down the page, on a fresh database. Top-level ``await`` is allowed (the
examples are written as if in an async function); a block that calls
``asyncio.run`` works too, since each page runs in a thread of its own, on an
event loop that is not running while a plain block executes.

What a page takes for granted is given by its ``Setting`` below: the
reader's own functions the examples call (``fetch_text``, ``load_pdf``...),
a ``boss`` on the test's database, and the example URL
``postgresql://localhost/app`` replaced by that database's. A block that
cannot run here (it serves until stopped, or names a deployment's servers)
is preceded by ``<!-- not run: REASON -->``; the reason is required.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shoal import FakeClock, Job, Shoal
from shoal.db import Database

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_URL = "postgresql://localhost/app"
FENCE = re.compile(r"^```python\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>\S.*\S) -->$")

Namespace = dict[str, Any]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the first line of code, 1-based
    code: str
    not_run: str | None


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            before = lines[i - 1].strip() if i else ""
            if before.startswith("<!-- not run") and not NOT_RUN.match(before):
                raise AssertionError(f"{page.name}:{i}: '<!-- not run: REASON -->' needs a reason")
            match = NOT_RUN.match(before)
            code = "\n".join(lines[start:end]) + "\n"
            found.append(Block(page, start + 1, code, match["why"] if match else None))
            i = end
        i += 1
    return found


# -- what each page takes for granted -------------------------------------------


async def fetch_text(ref: str) -> str | None:
    return f"A paper at {ref}\nits body"


def first_line(text: str) -> str:
    return text.splitlines()[0]


async def load_pdf(ref: str) -> str:
    return f"text of {ref}"


async def apply_observation(body: Any) -> None:
    pass


async def send_email(job: Job) -> dict[str, bool]:
    return {"sent": True}


@dataclass(frozen=True)
class Reading:
    card: str
    traffic_mb: int

    @classmethod
    def from_json(cls, data: Any) -> Reading:
        return cls(**data)

    def to_json(self) -> Any:
        return {"card": self.card, "traffic_mb": self.traffic_mb}


@dataclass
class Setting:
    """Names a page's examples use without defining, and what runs after its blocks."""

    seed: Callable[[str, Path], Awaitable[Namespace]]
    after: Callable[[Namespace], Awaitable[None]] | None = None
    replace: dict[str, str] = field(default_factory=dict)


async def _plain(url: str, tmp: Path) -> Namespace:
    return {}


async def _with_boss(url: str, tmp: Path) -> Namespace:
    return {"boss": await Shoal.connect(url), "url": url}


async def _readme(url: str, tmp: Path) -> Namespace:
    return {
        "fetch_text": fetch_text,
        "first_line": first_line,
        "apply_observation": apply_observation,
    }


async def _batch(url: str, tmp: Path) -> Namespace:
    return {"load_pdf": load_pdf}


async def _ingest(url: str, tmp: Path) -> Namespace:
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(url, min_size=1, max_size=2, open=False)
    await pool.open()
    applied: list[Any] = []
    written: list[Any] = []

    async def apply_traffic_observation(conn: Any, reading: Reading) -> None:
        await conn.execute("SELECT 1")
        applied.append(reading)

    async def insert_collection_records(records: list[Any]) -> None:
        written.extend(records)

    return {
        **await _with_boss(url, tmp),
        "Reading": Reading,
        "pool": pool,
        "reading": Reading("card-1", 12),
        "apply_traffic_observation": apply_traffic_observation,
        "insert_collection_records": insert_collection_records,
        "applied": applied,
    }


async def _ingest_after(ns: Namespace) -> None:
    assert ns["done"].route == "applied"  # sync mode, the default: applied in place
    assert ns["applied"] == [ns["reading"]]
    await ns["pipeline"].close()
    await ns["pool"].close()


async def _testing(url: str, tmp: Path) -> Namespace:
    clock = FakeClock()
    db = await Database(url).open()
    return {"db": db, "boss": Shoal(db, clock=clock), "clock": clock, "send_email": send_email}


async def _testing_after(ns: Namespace) -> None:
    # The complete example is a test function; call it as a test would, on
    # a client of its own whose clock the test moves.
    clock = FakeClock()
    ns["example_boss"] = boss = Shoal(ns["db"], clock=clock)  # closed with the page
    await ns["example"](boss, clock)


async def _observability_after(ns: Namespace) -> None:
    from shoal import tracing

    assert ns["port"] > 0
    ns["metrics"].close()
    tracing.uninstrument()  # the page turned tracing on; no later test runs traced
    ns["provider"].shutdown()


SETTINGS: dict[str, Setting] = {
    "README.md": Setting(_readme),
    "api.md": Setting(_plain),
    "batch.md": Setting(_batch),
    "from-celery.md": Setting(_with_boss),
    "from-pg-boss.md": Setting(_with_boss),
    "ingest.md": Setting(_ingest, _ingest_after, replace={"/var/lib/poller/spool": "{tmp}/spool"}),
    "ingest-nats.md": Setting(_plain),
    "limits.md": Setting(_with_boss),
    "observability.md": Setting(
        _with_boss,
        _observability_after,
        replace={'serve("127.0.0.1", 9300)': 'serve("127.0.0.1", 0)'},
    ),
    "queue.md": Setting(_with_boss),
    "sync.md": Setting(_plain),
    "testing.md": Setting(_testing, _testing_after),
    "upgrading.md": Setting(_plain),
}


# -- running a page ----------------------------------------------------------------


async def _close_all(*namespaces: Namespace) -> None:
    """Close every client and database a page made or was given (a block may rebind a name)."""
    values = {id(v): v for ns in namespaces for v in ns.values()}.values()
    for value in values:
        if isinstance(value, Shoal):
            await value.close()
    for value in values:
        if isinstance(value, Database):
            await value.close()


def run_page(page: Path, url: str, tmp: Path) -> int:
    """Run every block of ``page`` that is not marked; return how many ran."""
    setting = SETTINGS[page.name]
    loop = asyncio.new_event_loop()
    ns: Namespace = {"__name__": f"docs:{page.name}"}
    seeded: Namespace = {}
    ran = 0
    try:
        seeded = loop.run_until_complete(setting.seed(url, tmp))
        ns.update(seeded)
        for block in blocks_of(page):
            if block.not_run:
                continue
            code = block.code.replace(EXAMPLE_URL, url)
            for old, new in setting.replace.items():
                code = code.replace(old, new.format(tmp=tmp))
            # Blank lines first, so a traceback names the page's own line numbers.
            source = "\n" * (block.line - 1) + code
            compiled = compile(
                source, str(page.relative_to(ROOT)), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            if compiled.co_flags & inspect.CO_COROUTINE:
                loop.run_until_complete(eval(compiled, ns))
            else:
                exec(compiled, ns)
            ran += 1
        if setting.after is not None:
            loop.run_until_complete(setting.after(ns))
    finally:
        loop.run_until_complete(_close_all(seeded, ns))
        loop.close()
    return ran


PAGES_WITH_CODE = [page for page in PAGES if blocks_of(page)]


def test_every_page_with_python_blocks_has_a_setting() -> None:
    missing = [page.name for page in PAGES_WITH_CODE if page.name not in SETTINGS]
    assert not missing, f"add a Setting for {missing} in {Path(__file__).name}"


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.name)
def test_the_python_blocks_of_the_page_run(page: Path, db_url: str) -> None:
    if page.name not in SETTINGS:
        pytest.fail(f"no Setting for {page.name}")
    with tempfile.TemporaryDirectory() as tmp:
        ran = run_page(page, db_url, Path(tmp))
    blocks = blocks_of(page)
    assert ran == sum(1 for b in blocks if not b.not_run)
