"""The workbench's HTTP routes: uploads, templates, starting tasks; bad input names its field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from shoal_extract.serve import build_api

from .conftest import Bench

TOKEN = "extract-token"


@pytest.fixture
async def client(rules_bench: Bench) -> AsyncIterator[httpx.AsyncClient]:
    api = build_api(rules_bench.boss, rules_bench.bench.batches, rules_bench.bench, token=TOKEN)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as c:
        yield c


async def counts(bench: Bench) -> tuple[int, int]:
    docs = len(await bench.bench.all_documents())
    tasks = len(await bench.bench.batches.tasks(limit=500))
    return docs, tasks


def upload(client: httpx.AsyncClient, name: str | None, content: bytes) -> object:
    params = {} if name is None else {"filename": name}
    return client.post(
        "/v1/extraction/documents",
        params=params,
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )


async def test_the_same_file_uploaded_twice_is_one_document(
    client: httpx.AsyncClient, corpus_dir: Path
) -> None:
    content = (corpus_dir / "paper-01.pdf").read_bytes()
    first = await upload(client, "paper-01.pdf", content)  # type: ignore[misc]
    assert first.status_code == 201, first.text
    again = await upload(client, "renamed.pdf", content)  # type: ignore[misc]
    assert again.status_code == 200
    assert again.json()["document"]["id"] == first.json()["document"]["id"]
    assert again.json()["created"] is False
    listed = (await client.get("/v1/extraction/documents")).json()
    assert [d["filename"] for d in listed["documents"]] == ["paper-01.pdf"]
    assert listed["documents"][0]["format"] == "pdf"


@pytest.mark.parametrize(
    ("name", "content", "status", "field", "says"),
    [
        (None, b"hello", 422, "filename", "file name is required"),
        ("report.docx", b"PK\x03\x04", 422, "filename", "not a supported file type"),
        ("notes.txt", b"", 422, "body", "is empty"),
        ("\x01.pdf", b"%PDF-1.4", 422, "filename", "printable"),
    ],
)
async def test_bad_uploads_are_refused_naming_the_field_and_write_nothing(
    client: httpx.AsyncClient,
    rules_bench: Bench,
    name: str | None,
    content: bytes,
    status: int,
    field: str,
    says: str,
) -> None:
    response = await upload(client, name, content)  # type: ignore[misc]
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field and says in body["message"], body
    assert await counts(rules_bench) == (0, 0)


async def test_a_body_over_the_cap_is_413(rules_bench: Bench) -> None:
    from shoal.api import create_api
    from shoal_extract.api import mount_workbench

    api = mount_workbench(
        create_api(rules_bench.boss, rules_bench.bench.batches, token=None, max_body_bytes=1000),
        rules_bench.bench,
        token=None,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api),
        base_url="http://127.0.0.1",
        headers={"X-Shoal-Request": "1"},
    ) as c:
        response = await upload(c, "big.txt", b"x" * 5000)  # type: ignore[misc]
    assert response.status_code == 413
    assert await counts(rules_bench) == (0, 0)


async def test_routes_need_the_token(rules_bench: Bench) -> None:
    api = build_api(rules_bench.boss, rules_bench.bench.batches, rules_bench.bench, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1"
    ) as c:
        missing = await c.get("/v1/extraction/templates")
        wrong = await c.get("/v1/extraction/templates", headers={"Authorization": "Bearer nope"})
        page = await c.get("/extraction")
    assert missing.status_code == 401 and missing.json()["field"] == "authorization"
    assert wrong.status_code == 403
    assert page.status_code == 200 and "Extraction workbench" in page.text


async def test_templates_are_listed_and_a_new_one_is_validated(client: httpx.AsyncClient) -> None:
    listed = (await client.get("/v1/extraction/templates")).json()["templates"]
    assert {t["name"] for t in listed} == {"clinical_trial", "metadata"}
    bad = await client.post(
        "/v1/extraction/templates",
        json={"name": "mine", "fields": [{"name": "n", "type": "float", "description": "x"}]},
    )
    assert bad.status_code == 422 and bad.json()["field"] == "fields[0].type", bad.text
    mine = {"name": "mine", "fields": [{"name": "title", "type": "string", "description": "t"}]}
    created = await client.post("/v1/extraction/templates", json=mine)
    assert created.status_code == 201 and created.json()["template"]["version"] == 1
    same = await client.post("/v1/extraction/templates", json=mine)
    assert same.status_code == 200 and same.json()["created"] is False
    mine["fields"][0]["required"] = True  # type: ignore[index]
    changed = await client.post("/v1/extraction/templates", json=mine)
    assert changed.status_code == 201 and changed.json()["template"]["version"] == 2


async def test_starting_a_task_checks_every_field_before_writing(
    client: httpx.AsyncClient, rules_bench: Bench, corpus_dir: Path
) -> None:
    doc = (await upload(client, "p.txt", (corpus_dir / "paper-06.txt").read_bytes())).json()  # type: ignore[misc]
    doc_id = doc["document"]["id"]
    cases = [
        ({"document_ids": [], "template": "clinical_trial"}, "document_ids"),
        ({"document_ids": [doc_id, 999_999], "template": "clinical_trial"}, "document_ids[1]"),
        ({"document_ids": [doc_id, doc_id], "template": "clinical_trial"}, "document_ids[1]"),
        ({"document_ids": ["1"], "template": "clinical_trial"}, "document_ids[0]"),
        ({"document_ids": [doc_id], "template": "nope"}, "template"),
        ({"document_ids": [doc_id], "template": "metadata", "extractor": "magic"}, "extractor"),
        ({"document_ids": [doc_id], "template": "metadata", "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        response = await client.post("/v1/extraction/tasks", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["field"] == field, (body, response.json())
    assert await counts(rules_bench) == (1, 0)
    started = await client.post(
        "/v1/extraction/tasks",
        json={"document_ids": [doc_id], "template": "metadata", "idempotency_key": "click-1"},
    )
    assert started.status_code == 202, started.text
    repeat = await client.post(
        "/v1/extraction/tasks",
        json={"document_ids": [doc_id], "template": "metadata", "idempotency_key": "click-1"},
    )
    assert repeat.status_code == 200 and repeat.json()["task_id"] == started.json()["task_id"]
    task = (await client.get(f"/v1/tasks/{started.json()['task_id']}")).json()
    assert task["params"]["template"] == "metadata" and task["params"]["extractor"] == "rules"
    both = await client.post(
        "/v1/extraction/tasks",
        json={"document_ids": [doc_id], "template": "metadata", "extractor": "rules+llm"},
    )
    assert both.status_code == 202, both.text
    task = (await client.get(f"/v1/tasks/{both.json()['task_id']}")).json()
    assert task["params"]["extractor"] == "rules+llm"
    missing = await client.get("/v1/extraction/tasks/not-a-task/results")
    assert missing.status_code == 404


async def test_a_cross_site_form_to_any_workbench_write_is_refused_and_stores_nothing(
    rules_bench: Bench, corpus_dir: Path
) -> None:
    # The workbench mounts its routes on shoal's API: a form on another site,
    # posting to a token-less local API, must reach none of them.
    from shoal.api import create_api
    from shoal_extract.api import mount_workbench

    bench = rules_bench.bench
    api = mount_workbench(
        create_api(rules_bench.boss, bench.batches, token=None), bench, token=None
    )
    writes = sorted(
        (method.upper(), path)
        for path, operations in api.openapi()["paths"].items()
        for method in operations
        if path.startswith("/v1/extraction/") and method.upper() not in ("GET", "HEAD")
    )
    assert ("POST", "/v1/extraction/documents") in writes and len(writes) >= 5
    form = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Origin": "http://evil.example",
        "Sec-Fetch-Site": "cross-site",
    }
    content = (corpus_dir / "paper-01.pdf").read_bytes()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1"
    ) as c:
        for method, path in writes:
            url = path.replace("{task_id}", "00000000-0000-0000-0000-000000000000")
            answer = await c.request(method, url, headers=form, content=b"filename=x")
            assert answer.status_code == 403, (path, answer.text)
            assert answer.json()["field"] == "sec-fetch-site"
        rebound = await c.get("/v1/extraction/templates", headers={"Host": "evil.example"})
        bare = await upload(c, "paper-01.pdf", content)  # type: ignore[misc]
        page = await c.get("/extraction")
        own = await c.post(
            "/v1/extraction/documents",
            params={"filename": "paper-01.pdf"},
            content=content,
            headers={"Content-Type": "application/octet-stream", "X-Shoal-Request": "1"},
        )
    assert rebound.status_code == 421
    assert bare.status_code == 403 and bare.json()["field"] == "content-type"
    assert page.status_code == 200 and '"X-Shoal-Request": "1"' in page.text
    assert own.status_code == 201, own.text
    assert await counts(rules_bench) == (1, 0)
