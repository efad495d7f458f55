"""The workbench's whole flow as one durable workflow: import, extract, review, export.

>>> run = await bench.start_run(document_ids, "clinical_trial")   # doctest: +SKIP
>>> # ... a person reviews the values in the workbench, then says so:
>>> await bench.finish_review(task_id, reviewer="alice")           # doctest: +SKIP

Workflow ``extraction`` (declared by :class:`~shoal_extract.worker.ExtractionApp`,
run by every worker of the app). Each step is checkpointed, so a worker that
stops anywhere is followed by the next one without redoing what was done:

1. ``extraction.import``: a folder's files stored (content-hashed), or the given
   documents checked; the document ids.
2. ``extraction.plan``: the task's items and params (the template version is
   fixed here, once).
3. the batch task of kind ``extraction.document`` (``wf.batch``): each document
   parsed and extracted as a batch item, with the kind's limits, model budget and
   retries; the run holds no process meanwhile.
4. the wait for ``extraction.review:<task id>``: the reviewer's "done reviewing"
   (:meth:`Workbench.finish_review`). After the run's review timeout (3 days by
   default) the run goes on without it and says so in its result.
5. ``extraction.export``: CSV and JSON Lines of the task's results with the
   reviews made so far, written to the worker's export folder as
   ``extraction-<task id>.csv`` and ``.jsonl``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal import App, PermanentError, Workflow
from shoal_extract.export import FORMATS, write_export
from shoal_extract.kinds import FLOW, KIND, RUN_PARAM, FlowInput, review_key

if TYPE_CHECKING:
    from shoal_extract.workbench import Workbench

log = logging.getLogger("shoal_extract.flow")


def declare_flow(app: App, workbench: Callable[[], Workbench], *, export_dir: Path) -> None:
    """Declare workflow ``extraction`` on ``app``; ``workbench()`` is the attached workbench."""

    @app.workflow(FLOW)
    async def extraction(wf: Workflow, data: Any) -> dict[str, Any]:
        return await run_flow(wf, FlowInput.of(data), workbench(), export_dir)


async def run_flow(
    wf: Workflow, request: FlowInput, bench: Workbench, export_dir: Path
) -> dict[str, Any]:
    """One run of the flow (see the module's docstring); its result."""
    imported = await wf.step(import_documents, bench, request, name="extraction.import")
    items, params = await wf.step(
        plan_task, bench, imported["documents"], request, wf.id, name="extraction.plan"
    )
    task = await wf.batch(KIND, items, params=params)
    task_id = str(task["task_id"])
    result: dict[str, Any] = {
        "task_id": task_id,
        "outcome": task["outcome"],
        "progress": task["progress"],
    }
    if task["outcome"] == "cancelled":
        return result | {"review": {"status": "skipped"}, "exports": None}
    done = await wf.wait_for(review_key(task_id), timeout=request.review_timeout)
    exports = await wf.step(export_task, bench, task_id, export_dir, name="extraction.export")
    if done is None:
        review = {"status": "timed_out", "after_s": request.review_timeout.total_seconds()}
        log.warning(
            "extraction run %s: the review of task %s timed out after %s; exported with the "
            "%s values reviewed so far",
            wf.id,
            task_id,
            request.review_timeout,
            exports["reviewed_values"],
        )
    else:
        reviewer = done.get("reviewer") if isinstance(done, dict) else None
        review = {"status": "done", "reviewer": reviewer}
    return result | {"review": review, "exports": exports}


async def import_documents(bench: Workbench, request: FlowInput) -> dict[str, Any]:
    """The run's documents: a folder's files stored, or the given ids checked.

    ``{"documents": [ids], "new": how many were not stored before, "skipped":
    [files of a kind the workbench does not read]}``.
    """
    if request.folder is not None:
        report = await bench.import_folder(Path(request.folder))
        ids = [d.id for d in report.documents]
        return {"documents": ids, "new": report.new, "skipped": list(report.skipped)}
    ids = list(request.document_ids or ())
    found = await bench.store.documents_by_id(ids)
    missing = [d for d in ids if d not in found]
    if missing:
        raise PermanentError(f"documents {missing[:20]} do not exist")
    return {"documents": ids, "new": 0, "skipped": []}


async def plan_task(
    bench: Workbench, document_ids: list[int], request: FlowInput, run_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The task's items and params, naming the run (so its review can be finished)."""
    items, params = await bench.plan(document_ids, request.template, extractor=request.extractor)
    return items, params | {RUN_PARAM: run_id}


async def export_task(bench: Workbench, task_id: str, export_dir: Path) -> dict[str, Any]:
    """The task's results as CSV and JSON Lines in ``export_dir``; where, and how many."""
    page = await bench.all_results(task_id)
    paths = {}
    for fmt in FORMATS:
        path = Path(export_dir) / f"extraction-{task_id}.{fmt}"
        paths[fmt] = str(await asyncio.to_thread(write_export, page, fmt, path))
    return paths | {
        "documents": len(page.lines),
        "reviewed_values": sum(len(line.reviews) for line in page.lines),
        "corrected_values": sum(len(line.corrected) for line in page.lines),
    }


__all__ = ["declare_flow", "run_flow"]
