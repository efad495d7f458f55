"""Review and re-run over HTTP: accept or correct a value, the exports carry it, the
extractor is scored against the reviews; one document (or the failed ones) re-run as
a new task with another template. Refusals name the bad field; read-only refuses writes.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoal import Shoal
from shoal_extract.serve import build_api
from shoal_extract.workbench import Upload

from .conftest import Bench, open_bench
from .test_llm import run_until_closed

TOKEN = "review-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FILES = ("paper-01.pdf", "paper-06.txt", "broken-truncated.pdf")


@pytest.fixture
async def reviewed(
    boss: Shoal, corpus_dir: Path
) -> AsyncIterator[tuple[Bench, httpx.AsyncClient, str, dict[str, int]]]:
    """A closed rules task over two papers and a broken file, and a client as alice."""
    bench = await open_bench(boss)
    stored = await bench.bench.upload([Upload(f, (corpus_dir / f).read_bytes()) for f in FILES])
    ids = {d.filename: d.id for d in stored}
    created = await bench.bench.start(list(ids.values()), "clinical_trial")
    await run_until_closed(bench, created.task_id)
    api = build_api(boss, bench.bench.batches, bench.bench, token=TOKEN, token_name="alice")
    transport = httpx.ASGITransport(app=api)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=AUTH
        ) as client:
            yield bench, client, created.task_id, ids
    finally:
        await bench.extraction.close()


async def _items(client: httpx.AsyncClient, task_id: str) -> dict[str, dict[str, Any]]:
    got = await client.get(f"/v1/extraction/tasks/{task_id}/results")
    assert got.status_code == 200, got.text
    return {r["file"]: r for r in got.json()["results"]}


async def test_a_corrected_value_is_stored_with_who_and_when_and_exported(
    reviewed: tuple[Bench, httpx.AsyncClient, str, dict[str, int]], key: dict[str, Any]
) -> None:
    bench, client, task_id, _ = reviewed
    truth = {d["file"]: d["fields"] for d in key["documents"]}["paper-01.pdf"]
    paper = (await _items(client, task_id))["paper-01.pdf"]
    url = f"/v1/extraction/tasks/{task_id}/reviews"

    corrected = await client.post(
        url,
        json={"item_id": paper["item_id"], "field": "title", "action": "correct", "value": "Fixed"},
    )
    assert corrected.status_code == 201, corrected.text
    review = corrected.json()["review"]
    assert review["reviewer"] == "alice" and review["action"] == "corrected"
    assert review["original"] == truth["title"] and review["value"] == "Fixed" and review["at"]
    accepted = await client.post(
        url, json={"item_id": paper["item_id"], "field": "year", "action": "accept"}
    )
    assert accepted.status_code == 201 and accepted.json()["review"]["value"] == truth["year"]

    # The results show the corrected value, say it was corrected, keep the original.
    paper = (await _items(client, task_id))["paper-01.pdf"]
    assert paper["fields"]["title"] == "Fixed" and paper["corrected"] == ["title"]
    assert paper["reviews"]["title"]["original"] == truth["title"]
    assert paper["reviews"]["year"]["action"] == "accepted"

    exported = await client.get(f"/v1/extraction/tasks/{task_id}/export?format=csv")
    rows = {r["file"]: r for r in csv.DictReader(io.StringIO(exported.text))}
    row = rows["paper-01.pdf"]
    assert row["title"] == "Fixed" and row["corrected"] == "title"
    assert row["title.review"] == "corrected" and row["title.original"] == truth["title"]
    assert row["title.reviewer"] == "alice" and row["title.reviewed_at"]
    assert row["year.review"] == "accepted" and row["year.original"] == str(truth["year"])
    assert rows["paper-06.txt"]["corrected"] == "" and rows["paper-06.txt"]["title.review"] == ""
    lines = (await client.get(f"/v1/extraction/tasks/{task_id}/export?format=jsonl")).text
    line = next(json.loads(x) for x in lines.splitlines() if "paper-01.pdf" in x)
    assert line["fields"]["title"] == "Fixed" and line["corrected"] == ["title"]
    assert line["reviews"]["title"]["original"] == truth["title"]

    # Scored against the reviews: the extractor's title was corrected (wrong), its year
    # accepted (right); what it extracted is scored, never the correction.
    report = await bench.bench.evaluate(task_id, await bench.bench.reviewed_key(task_id))
    scores = {f.name: (f.correct, f.total) for f in report.fields}
    assert scores == {"title": (0, 1), "year": (1, 1)}
    assert report.documents == 1 and report.unmatched == 2


BAD_REVIEWS: list[tuple[dict[str, Any], str, str]] = [
    ({"field": "nope", "action": "correct", "value": "x"}, "field", "not a field of"),
    ({"field": "year", "action": "correct", "value": "soon"}, "value", "year"),
    ({"field": "year", "action": "correct"}, "value", "correct needs the value"),
    ({"field": "year", "action": "accept", "value": 2001}, "value", "accept takes no value"),
    ({"field": "year", "action": "approve"}, "action", ""),
    ({"item_id": 999999, "field": "year", "action": "accept"}, "item_id", "has no item"),
    ({"item_id": "broken", "field": "year", "action": "accept"}, "item_id", "error"),
]


async def test_bad_reviews_are_refused_naming_the_field_and_write_nothing(
    reviewed: tuple[Bench, httpx.AsyncClient, str, dict[str, int]], boss: Shoal
) -> None:
    bench, client, task_id, _ = reviewed
    items = await _items(client, task_id)
    for body, field, says in BAD_REVIEWS:
        item_id = body.get("item_id", items["paper-01.pdf"]["item_id"])
        if item_id == "broken":
            item_id = items["broken-truncated.pdf"]["item_id"]
        got = await client.post(
            f"/v1/extraction/tasks/{task_id}/reviews", json={**body, "item_id": item_id}
        )
        assert got.status_code == 422, got.text
        assert got.json()["field"].endswith(field) and says in got.json()["message"], got.text
    assert all(not r["reviews"] for r in (await _items(client, task_id)).values())

    # A read-only API refuses reviews and re-runs, and still answers reads.
    item_id = items["paper-01.pdf"]["item_id"]
    api = build_api(boss, bench.bench.batches, bench.bench, token=TOKEN, read_only=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://127.0.0.1", headers=AUTH
    ) as read_only:
        for path, body in (
            ("reviews", {"item_id": item_id, "field": "year", "action": "accept"}),
            ("rerun", {"documents": "failed"}),
        ):
            got = await read_only.post(f"/v1/extraction/tasks/{task_id}/{path}", json=body)
            assert got.status_code == 403 and got.json()["field"] == "method", got.text
        assert (await read_only.get(f"/v1/extraction/tasks/{task_id}/results")).status_code == 200


async def test_one_document_and_the_failed_ones_rerun_as_new_tasks(
    reviewed: tuple[Bench, httpx.AsyncClient, str, dict[str, int]],
) -> None:
    bench, client, task_id, ids = reviewed
    url = f"/v1/extraction/tasks/{task_id}/rerun"
    # One paper again with another template: a new task that says what it re-runs.
    got = await client.post(url, json={"documents": [ids["paper-06.txt"]], "template": "metadata"})
    assert got.status_code == 202, got.text
    again = got.json()
    assert again["rerun_of"] == task_id and again["document_ids"] == [ids["paper-06.txt"]]
    await run_until_closed(bench, again["task_id"])
    view = await bench.bench.task(again["task_id"])
    assert view.params["rerun_of"] == task_id and view.params["template"] == "metadata"
    rows = await _items(client, again["task_id"])
    assert list(rows) == ["paper-06.txt"] and rows["paper-06.txt"]["status"] == "completed"
    assert set(rows["paper-06.txt"]["fields"]) == {"title", "authors", "year", "journal", "doi"}
    # The failed ones, with the task's own template and extractor.
    failed = await client.post(url, json={"documents": "failed"})
    assert failed.status_code == 202 and failed.json()["document_ids"] == [
        ids["broken-truncated.pdf"]
    ]
    # The original task is as it was.
    assert set(await _items(client, task_id)) == set(FILES)

    for body, field in (
        ({"documents": [999999]}, "documents[0]"),
        ({"documents": "all"}, "documents"),
        ({"documents": [ids["paper-01.pdf"]], "template_version": 99}, "template_version"),
        ({"documents": [ids["paper-01.pdf"]], "extractor": "magic"}, "extractor"),
    ):
        refused = await client.post(url, json=body)
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"].startswith(field), refused.json()
    none_failed = await client.post(
        f"/v1/extraction/tasks/{again['task_id']}/rerun", json={"documents": "failed"}
    )
    assert none_failed.status_code == 422 and "no failed documents" in none_failed.text
