"""The API fuzzed from its own OpenAPI document (schemathesis), in-process over ASGI.

For each operation, schemathesis generates requests that fit the schema
(positive) and requests that break it (negative). Every answer must be below
500, and every 4xx must carry shoal's error body with a message. Operations on
one task run twice: with generated ids, and with the id of a real task, so the
generated query strings reach the database.

Bounded: ``MAX_EXAMPLES`` per operation and mode, no shrinking database kept
between runs, about a minute in all.

Derandomized: the test command draws the same examples on every run, so it
passes or fails on the code alone, never on the luck of the draw. To hunt for
new failures, set ``SHOAL_FUZZ_EXPLORE=N``: N fresh random examples per
operation and mode (``SHOAL_FUZZ_EXPLORE=500 .venv/bin/pytest tests/test_api_fuzz.py``).
A failure found that way is then fixed and, where the draw would not repeat
it, pinned with an explicit example in the test that covers the route.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi as schemathesis_asgi

from shoal import Shoal
from shoal.api import create_api
from shoal.db.pool import Database

from .conftest import create_database, drop_database, with_dbname
from .test_api import KIND, TEST_APP

EXPLORE = int(os.environ.get("SHOAL_FUZZ_EXPLORE", "0") or 0)
MAX_EXAMPLES = EXPLORE or 50

ASGI = Any
Message = dict[str, Any]


class ApiOnItsOwnLoop:
    """``create_api`` over a pool opened inside the event loop that serves it.

    schemathesis runs the ASGI app on an event loop of its own (in a thread);
    a psycopg pool belongs to the loop that opened it. So the pool is opened,
    and the app built, in the app's lifespan startup, on that loop.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.api: ASGI = None
        self.boss: Shoal | None = None
        self.task_id: str | None = None

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.api(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                db = await Database(self.url, max_size=5).open()
                self.boss = Shoal(db, listen=False)
                batches = TEST_APP.batches(self.boss)
                # Starlette's test client (what schemathesis calls with) says
                # Host: testserver.
                self.api = create_api(
                    self.boss,
                    batches,
                    token=None,
                    max_body_bytes=64 * 1024,
                    allowed_hosts=["testserver"],
                )
                created = await batches.create(KIND, ["a", {"ref": "b", "data": {"fail": True}}])
                self.task_id = created.task_id
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.boss is not None:
                    await self.boss.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


@pytest.fixture(scope="module")
def fuzz_target(pg_server: str, template_db: str) -> Iterator[ApiOnItsOwnLoop]:
    name = create_database(pg_server, template_db)
    target = ApiOnItsOwnLoop(with_dbname(pg_server, name))
    try:
        yield target
    finally:
        schemathesis_asgi.shutdown_lifespans()
        drop_database(pg_server, name)


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_target: ApiOnItsOwnLoop) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_target)


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) of every documented operation, read from an app never served.

    Negative cases exist only for operations with a body or query to break: a
    path id is any string, so no request breaks its schema.
    """
    unopened = Shoal(Database("postgresql://unused.invalid/none"), listen=False)
    spec = create_api(unopened, TEST_APP.batches(unopened), token=None).openapi()
    found = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            found.append((method.upper(), path, GenerationMode.POSITIVE))
            takes_input = op.get("requestBody") or any(
                p["in"] != "path" for p in op.get("parameters", [])
            )
            if takes_input:
                found.append((method.upper(), path, GenerationMode.NEGATIVE))
    return sorted(found)


OPERATIONS = _operations()


def check_answer(response: Any) -> None:
    """No 5xx; every 4xx is shoal's error body with a message."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict), body
        assert isinstance(body.get("message"), str) and body["message"], body
        assert isinstance(body.get("error"), str), body
        assert "field" in body, body


def _fuzz(operation: Any, mode: GenerationMode, **fixed: Any) -> None:
    strategy = operation.as_strategy(generation_mode=mode, **fixed)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not EXPLORE,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        # As the console page does: else every bodiless write is refused
        # before its route (a form could send it) and never fuzzed.
        response = case.call(headers={"X-Shoal-Request": "1"})
        check_answer(response)
        case.validate_response(response, checks=[not_a_server_error])

    run()


@pytest.mark.parametrize(("method", "path", "mode"), OPERATIONS)
def test_no_operation_answers_5xx_and_every_4xx_has_a_message(
    fuzz_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    _fuzz(fuzz_schema[path][method], mode)


TASK_OPERATIONS = [op for op in OPERATIONS if "{task_id}" in op[1]]


@pytest.mark.parametrize(("method", "path", "mode"), TASK_OPERATIONS)
def test_operations_on_a_real_task_answer_no_5xx(
    fuzz_schema: Any, fuzz_target: ApiOnItsOwnLoop, method: str, path: str, mode: GenerationMode
) -> None:
    assert fuzz_target.task_id is not None
    _fuzz(fuzz_schema[path][method], mode, path_parameters={"task_id": fuzz_target.task_id})
