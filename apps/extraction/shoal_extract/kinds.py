"""What the workbench declares on shoal: its batch kind, its workflow, and the workflow's input.

A leaf: the worker, the workbench and the flow (:mod:`shoal_extract.flow`) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shoal import InvalidInput
from shoal_extract.extractors.fill import NAME as RULES_LLM

KIND = "extraction.document"
EXTRACTORS = ("rules", "llm", RULES_LLM)
DEFAULT_EXTRACTOR = "rules"

# The workflow that runs the whole flow (import, extract, review, export).
FLOW = "extraction"
# The task's param that names the run it belongs to (the reviewer's "done" finds it there).
RUN_PARAM = "workflow_run"
# A reviewer has a few days, weekends included, before the run exports without them.
DEFAULT_REVIEW_TIMEOUT = timedelta(days=3)
MAX_REVIEW_TIMEOUT = timedelta(days=365)


def review_key(task_id: str) -> str:
    """The event a run waits for once its task is extracted: the reviewer's "done reviewing"."""
    return f"extraction.review:{task_id}"


@dataclass(frozen=True, slots=True)
class FlowInput:
    """A run's input: the stored documents or a folder to import, and how to extract them."""

    template: str
    extractor: str = DEFAULT_EXTRACTOR
    review_timeout: timedelta = DEFAULT_REVIEW_TIMEOUT
    document_ids: tuple[int, ...] | None = None
    folder: str | None = None

    def __post_init__(self) -> None:
        if (self.document_ids is None) == (self.folder is None):
            raise InvalidInput("document_ids", "a run takes document ids or a folder, one of them")
        if not isinstance(self.template, str) or not self.template:
            raise InvalidInput("template", f"must be a template name, got {self.template!r:.80}")
        if self.extractor not in EXTRACTORS:
            raise InvalidInput(
                "extractor", f"must be one of {', '.join(EXTRACTORS)}, got {self.extractor!r:.40}"
            )
        timeout = self.review_timeout
        if not isinstance(timeout, timedelta) or not timedelta(0) < timeout <= MAX_REVIEW_TIMEOUT:
            raise InvalidInput(
                "review_timeout",
                f"must be more than 0 and at most {MAX_REVIEW_TIMEOUT.days} days, got {timeout!r}",
            )

    def as_data(self) -> dict[str, Any]:
        """The run's stored input (JSON)."""
        return {
            "template": self.template,
            "extractor": self.extractor,
            "review_timeout_s": self.review_timeout.total_seconds(),
            "document_ids": None if self.document_ids is None else list(self.document_ids),
            "folder": self.folder,
        }

    @classmethod
    def of(cls, data: Any) -> FlowInput:
        """The input a run stored; InvalidInput names what is wrong with it."""
        if not isinstance(data, dict):
            raise InvalidInput("input", f"an extraction run's input is an object, got {data!r:.80}")
        seconds = data.get("review_timeout_s", DEFAULT_REVIEW_TIMEOUT.total_seconds())
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidInput("review_timeout_s", f"must be a number, got {seconds!r:.40}")
        if not 0 < seconds <= MAX_REVIEW_TIMEOUT.total_seconds():
            raise InvalidInput(
                "review_timeout_s",
                f"must be more than 0 and at most {MAX_REVIEW_TIMEOUT.total_seconds():.0f}, "
                f"got {seconds!r:.40}",
            )
        ids = data.get("document_ids")
        return cls(
            template=data.get("template"),  # type: ignore[arg-type]  # checked in __post_init__
            extractor=data.get("extractor", DEFAULT_EXTRACTOR),
            review_timeout=timedelta(seconds=seconds),
            document_ids=None if ids is None else tuple(ids),
            folder=data.get("folder"),
        )


__all__ = [
    "DEFAULT_EXTRACTOR",
    "DEFAULT_REVIEW_TIMEOUT",
    "EXTRACTORS",
    "FLOW",
    "KIND",
    "MAX_REVIEW_TIMEOUT",
    "RUN_PARAM",
    "FlowInput",
    "review_key",
]
