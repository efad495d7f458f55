"""Every code block of the README and of docs/ runs, as a reader copies it.

A page's blocks run in order, as a reader reads them down the page, on a
fresh database with shoal's schema migrated: the Python blocks in one
namespace, the SQL blocks on a connection of their own (autocommit, so a
block may hold its own BEGIN/COMMIT). ``DATABASE_URL`` names that database
while the page runs, and the current directory is a temporary one: a page
opens what it uses from ``os.environ["DATABASE_URL"]`` in its own blocks, as
a reader's copy would, and a SQL block that needs a table creates it.

The test supplies nothing else but the reader's own domain code, the
functions and types an example calls but that are the reader's to write
(``fetch_text``, ``load_pdf``...): ``READER_OWN`` below, the whole list. A
page that uses any other name it never defines fails
``test_a_page_defines_every_name_it_uses``, before anything runs.

Top-level ``await`` is allowed (the examples are written as if in an async
function); a block that calls ``asyncio.run`` works too, since a plain block
runs while the page's event loop is not running. A block that cannot run
here (it serves until stopped, names a deployment's servers, or is a file of
another tool) is preceded by ``<!-- not run: REASON -->``; the reason is
required. What a page leaves open (a metrics server, a tracer) is closed
after it by its ``CLEANUP`` entry; clients and pools it opened are closed
whatever they are named.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import re
import symtable
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from shoal import Job, Shoal, SyncClient
from shoal.db import Database

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>python|sql)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>\S.*\S) -->$")

Namespace = dict[str, Any]


@dataclass(frozen=True)
class Block:
    page: Path
    lang: str  # python | sql
    line: int  # of the first line of code, 1-based
    code: str
    not_run: str | None


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            before = lines[i - 1].strip() if i else ""
            if before.startswith("<!-- not run") and not NOT_RUN.match(before):
                raise AssertionError(f"{page.name}:{i}: '<!-- not run: REASON -->' needs a reason")
            match = NOT_RUN.match(before)
            code = "\n".join(lines[start:end]) + "\n"
            found.append(
                Block(page, fence["lang"], start + 1, code, match["why"] if match else None)
            )
            i = end
        i += 1
    return found


def runnable(page: Path) -> list[Block]:
    return [block for block in blocks_of(page) if not block.not_run]


# -- the reader's own code: all the test supplies ---------------------------------
#
# The functions and types an example calls as the reader's own domain code,
# which no page could define without burying its point: what fetching a
# paper, parsing a PDF or writing a reading means is the reader's business.
# Every other name a page uses, it defines.


@dataclass(frozen=True)
class Reading:
    """ingest.md: the reader's message type, with its own JSON codec."""

    card: str
    traffic_mb: int

    @classmethod
    def from_json(cls, data: Any) -> Reading:
        return cls(**data)

    def to_json(self) -> Any:
        return {"card": self.card, "traffic_mb": self.traffic_mb}


def reader_own() -> Namespace:
    """A fresh set of the reader's own functions and types, for one page."""
    applied: list[Any] = []

    async def fetch_text(ref: str) -> str | None:  # README: a paper's text, None if unreadable
        return f"A paper at {ref}\nits body"

    def first_line(text: str) -> str:  # README
        return text.splitlines()[0]

    async def apply_observation(body: Any) -> None:  # README: one idempotent transaction
        applied.append(body)

    async def load_pdf(ref: str) -> str:  # batch.md
        return f"text of {ref}"

    async def send_email(job: Job) -> dict[str, bool]:  # testing.md: a handler under test
        return {"sent": True}

    async def apply_traffic_observation(conn: Any, reading: Reading) -> None:  # ingest.md
        await conn.execute("SELECT 1")
        applied.append(reading)

    async def insert_collection_records(records: list[Any]) -> None:  # ingest.md
        applied.extend(records)

    return {
        "Reading": Reading,
        "apply_observation": apply_observation,
        "apply_traffic_observation": apply_traffic_observation,
        "fetch_text": fetch_text,
        "first_line": first_line,
        "insert_collection_records": insert_collection_records,
        "load_pdf": load_pdf,
        "send_email": send_email,
        # not a name the pages use: what the reader's functions above applied
        "_applied": applied,
    }


READER_OWN = frozenset(name for name in reader_own() if not name.startswith("_"))


# -- what a page leaves open, closed after it ------------------------------------


async def _ingest(ns: Namespace) -> None:
    assert ns["done"].route == "applied"  # sync mode, the default: applied in place
    assert ns["_applied"] == [ns["reading"]]
    await ns["pipeline"].close()


async def _observability(ns: Namespace) -> None:
    from shoal import tracing

    assert ns["port"] > 0
    ns["metrics"].close()
    tracing.uninstrument()  # the page turned tracing on; no later test runs traced
    ns["provider"].shutdown()


CLEANUP: dict[str, Callable[[Namespace], Awaitable[None]]] = {
    "ingest.md": _ingest,
    "observability.md": _observability,
}


# -- names a page uses without defining them ---------------------------------------


def _globals_read(table: symtable.SymbolTable, *, top: bool = True) -> set[str]:
    """Module-level names a block's code reads, at its top or from any function or class."""
    names = set()
    for symbol in table.get_symbols():
        if not symbol.is_referenced():
            continue
        if symbol.is_global() if not top else not (symbol.is_assigned() or symbol.is_imported()):
            names.add(symbol.get_name())
    for child in table.get_children():
        names |= _globals_read(child, top=False)
    return names


def undefined_names(blocks: list[Block]) -> dict[str, int]:
    """Module-level names the Python blocks read but no block binds, with the first line read.

    Scopes are Python's own (``symtable``): a function's parameter named
    ``boss`` defines nothing for the code that calls it. The blocks are one
    module (a name bound in any block counts as defined on the whole page).
    """
    bound: set[str] = set()
    read: dict[str, int] = {}
    for block in blocks:
        if block.lang != "python":
            continue
        table = symtable.symtable(block.code, str(block.page), "exec")
        bound |= {
            symbol.get_name()
            for symbol in table.get_symbols()
            if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()
        }
        used = _globals_read(table)
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Name) and node.id in used:
                read.setdefault(node.id, block.line + node.lineno - 1)
    return {
        name: line
        for name, line in read.items()
        if name not in bound and not hasattr(builtins, name) and name not in READER_OWN
    }


# -- running a page ----------------------------------------------------------------


async def _close_all(ns: Namespace) -> None:
    """Close every client, pool and database the page left open (a block may rebind a name)."""
    values = list({id(v): v for v in ns.values()}.values())
    for value in values:
        if isinstance(value, Shoal):
            await value.close()
        elif isinstance(value, SyncClient):
            value.close()
    for value in values:
        if isinstance(value, Database | AsyncConnectionPool):
            await value.close()


def _run_sql(block: Block, url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute(block.code.encode())
        except psycopg.Error as exc:
            where = f"{block.page.relative_to(ROOT)}:{block.line}"
            raise AssertionError(f"{where}: the SQL block failed: {exc}") from exc


def run_page(page: Path, url: str) -> int:
    """Run every block of ``page`` that is not marked; return how many ran."""
    loop = asyncio.new_event_loop()
    ns: Namespace = {"__name__": f"docs:{page.name}", **reader_own()}
    ran = 0
    try:
        for block in runnable(page):
            if block.lang == "sql":
                _run_sql(block, url)
                ran += 1
                continue
            # Blank lines first, so a traceback names the page's own line numbers.
            source = "\n" * (block.line - 1) + block.code
            compiled = compile(
                source, str(page.relative_to(ROOT)), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            if compiled.co_flags & inspect.CO_COROUTINE:
                loop.run_until_complete(eval(compiled, ns))
            else:
                exec(compiled, ns)
            ran += 1
        cleanup = CLEANUP.get(page.name)
        if cleanup is not None:
            loop.run_until_complete(cleanup(ns))
    finally:
        loop.run_until_complete(_close_all(ns))
        loop.close()
    return ran


PAGES_WITH_CODE = [page for page in PAGES if runnable(page)]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.name)
def test_a_page_defines_every_name_it_uses(page: Path) -> None:
    undefined = undefined_names(runnable(page))
    where = ", ".join(f"{name!r} (line {line})" for name, line in sorted(undefined.items()))
    assert not undefined, (
        f"{page.relative_to(ROOT)} uses {where} but never defines it: open it in the page "
        "(from os.environ['DATABASE_URL'] for a client), or, for the reader's own domain "
        f"code, add it to READER_OWN in {Path(__file__).name}"
    )


def test_the_reader_own_list_is_short_and_used() -> None:
    used = set()
    for page in PAGES_WITH_CODE:
        for block in runnable(page):
            if block.lang == "python":
                used |= {n.id for n in ast.walk(ast.parse(block.code)) if isinstance(n, ast.Name)}
    assert not READER_OWN - used, f"not used by any page: {READER_OWN - used}"


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.name)
def test_the_code_blocks_of_the_page_run(
    page: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    ran = run_page(page, db_url)
    assert ran == len(runnable(page))
