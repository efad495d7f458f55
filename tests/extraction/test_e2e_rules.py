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
            assert line.status == "error" and line.error and "ParseError: " in line.error
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
    # Every value carries its evidence: page, confidence, the quoted passage.
    paper = next(r for r in rows if r["file"] == "paper-01.pdf")
    assert paper["title.page"] == "1" and float(paper["title.confidence"]) > 0.5
    assert paper["sample_size"] in paper["sample_size.quote"]
    assert paper["flagged"] == ""
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
    for line in lines:
        assert set(line["evidence"]) == {k for k, v in line["fields"].items() if v is not None}
        assert all(ev["verified"] and ev["page"] == 1 for ev in line["evidence"].values())
    bad = main([*base, "run", "--template", "nope"])
    assert bad == 2 and "template: unknown template 'nope'" in capsys.readouterr().err


async def test_a_second_template_over_the_same_papers_does_not_parse_them_again(
    rules_bench: Bench, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shoal_extract.parsing as parsing
    import shoal_extract.worker as worker_module

    parsed: list[int] = []
    real = parsing.parse_document

    def counting(content: bytes, *args: Any) -> Any:
        parsed.append(len(content))
        return real(content, *args)

    monkeypatch.setattr(worker_module, "parse_document", counting)
    bench = rules_bench.bench
    imported = await bench.import_folder(corpus_dir)
    papers = [d for d in imported.documents if d.filename.startswith("paper-")][:4]
    ids = [d.id for d in papers]
    first = await bench.start(ids, "clinical_trial")
    await run_until_closed(rules_bench, first.task_id)
    assert len(parsed) == len(ids)
    assert await bench.store.parse_count([d.sha256 for d in papers]) == len(ids)

    second = await bench.start(ids, "metadata")
    await run_until_closed(rules_bench, second.task_id)
    assert len(parsed) == len(ids), "the stored parses were read, nothing parsed again"
    page = await bench.all_results(second.task_id)
    assert all(line.status == "completed" and line.fields["title"] for line in page.lines)


def test_evaluate_reports_held_out_layouts_apart(
    db_url: str,
    hard_dir: Path,
    hard_key: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    tesseract: str,
) -> None:
    base = ["--database-url", db_url]
    key_path = str(hard_dir / "key.json")
    assert main([*base, "import", str(hard_dir)]) == 0
    assert main([*base, "run", "--template", "clinical_trial", "--key", key_path]) == 0
    capsys.readouterr()
    assert main([*base, "evaluate", "--key", key_path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    held = sum(d["held_out"] for d in hard_key["documents"])
    assert held and report["documents"] == len(hard_key["documents"])
    seen_part, held_part = report["parts"].values()
    assert held_part["documents"] == held
    assert seen_part["documents"] == len(hard_key["documents"]) - held
    # On the layouts they were written against the rules read the sample size
    # from a table and from page 44. Outside OCRed text a miss is a not-found,
    # never a wrong value; OCR's misreads ("HbA'1c") do come through as values.
    assert seen_part["fields"]["sample_size"]["accuracy"] == 1.0
    scans = {d["file"] for d in hard_key["documents"] if d["layout"] == "scan"}
    wrong = [m for m in report["misses"] if m["got"] is not None and m["file"] not in scans]
    assert not wrong, wrong
    assert main([*base, "evaluate", "--key", key_path]) == 0
    out = capsys.readouterr().out
    assert "held-out layouts" in out and "layouts the rules were written against" in out
