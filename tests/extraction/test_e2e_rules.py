"""End to end with the rules extractor: the sample corpus through shoal's workers, and the CLI."""

from __future__ import annotations

import asyncio
import csv
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal.batch.states import ItemStatus, TaskStatus
from shoal_extract.cli import main
from shoal_extract.evaluate import load_key
from tests.conftest import wait_for

from .conftest import Bench


async def run_until_closed(bench: Bench, task_id: str, timeout_s: float = 30) -> None:
    stop = asyncio.Event()
    runner = asyncio.create_task(
        bench.extraction.app.run(bench.boss, stop=stop, grace=timedelta(seconds=1))
    )
    try:

        async def closed() -> bool:
            return (await bench.bench.batches.get(task_id)).status is not TaskStatus.PROCESSING

        await wait_for(closed, timeout_s=timeout_s)
    finally:
        stop.set()
        await runner


async def test_every_sample_document_ends_completed_or_error_exactly_once(
    rules_bench: Bench, corpus_dir: Path, key: dict[str, Any]
) -> None:
    bench = rules_bench.bench
    imported = await bench.import_folder(corpus_dir)
    assert len(imported.documents) == len(key["documents"]) and imported.skipped == ("key.json",)
    again = await bench.import_folder(corpus_dir)
    assert again.new == 0, "the same files are the same documents"
    created = await bench.start([d.id for d in imported.documents], "clinical_trial")
    await run_until_closed(rules_bench, created.task_id)

    view = await bench.batches.get(created.task_id)
    assert view.status is TaskStatus.COMPLETED
    broken = {d["file"] for d in key["documents"] if d["expected"] == "error"}
    assert (view.progress.completed, view.progress.error) == (
        len(key["documents"]) - len(broken),
        len(broken),
    )
    page = await bench.all_results(created.task_id)
    assert sorted(line.document_id or 0 for line in page.lines) == sorted(
        d.id for d in imported.documents
    ), "one item per document"
    for line in page.lines:
        assert line.status in (ItemStatus.COMPLETED, ItemStatus.ERROR)
        assert line.attempts == 1, "rules never need a retry"
        if line.file in broken:
            assert line.status == "error" and line.error and "ParseError: pypdf" in line.error
        else:
            assert line.status == "completed" and line.fields["title"]
    report = await bench.evaluate(created.task_id, load_key(corpus_dir / "key.json"))
    right = {f.name: f.correct for f in report.fields}
    total = {f.name: f.total for f in report.fields}
    assert right["title"] == right["year"] == right["doi"] == total["title"]
    assert report.status_right == report.documents == len(key["documents"])
    # A field the rules could not read is a field error on the item, not a guess.
    missing = [line for line in page.lines if line.field_errors]
    assert missing and all(
        line.fields[name] is None for line in missing for name in line.field_errors
    )


def test_the_cli_imports_runs_evaluates_and_exports(
    db_url: str, corpus_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", db_url]
    key_path = str(corpus_dir / "key.json")
    assert main([*base, "import", str(corpus_dir)]) == 0
    assert "45 documents, 45 new" in capsys.readouterr().out
    assert main([*base, "templates", "--json"]) == 0
    names = [t["name"] for t in json.loads(capsys.readouterr().out)]
    assert names == ["clinical_trial", "metadata"]
    assert main([*base, "run", "--template", "clinical_trial", "--key", key_path]) == 0
    out = capsys.readouterr().out
    assert "completed_with_errors" in out and "accuracy against the key" in out
    assert main([*base, "evaluate", "--key", key_path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fields = report["fields"]
    for name in ("title", "year", "doi"):
        assert fields[name]["accuracy"] == 1.0, fields[name]
    assert report["status_right"] == report["documents"] == 45
    # Every miss is a not-found: the rules do not guess.
    assert all(m["got"] is None for m in report["misses"])
    out_csv = tmp_path / "out.csv"
    assert (
        main(
            [*base, "export", "--task", report["task_id"], "--format", "csv", "--out", str(out_csv)]
        )
        == 0
    )
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 45 and {"title", "year", "doi", "field_errors", "tokens"} <= set(rows[0])
    out_jsonl = tmp_path / "out.jsonl"
    assert (
        main(
            [
                *base,
                "export",
                "--task",
                report["task_id"],
                "--format",
                "jsonl",
                "--out",
                str(out_jsonl),
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in out_jsonl.read_text().splitlines()]
    assert {line["status"] for line in lines} == {"completed", "error"}
    bad = main([*base, "run", "--template", "nope"])
    assert bad == 2 and "template: unknown template 'nope'" in capsys.readouterr().err
