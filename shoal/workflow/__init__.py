"""Durable workflows: multi-step work that survives crashes and waits without holding a process.

A workflow is an async function ``fn(wf, input)``, declared with
``@app.workflow(name)``; its steps (``wf.step``), timers (``wf.sleep``) and
waits for events (``wf.wait_for``) are checkpointed, so a run resumes after a
crash or a deploy where it stopped (docs/workflows.md).
"""

from shoal.workflow.context import Workflow
from shoal.workflow.runner import WorkflowSpec
from shoal.workflow.runtime import current_workflow
from shoal.workflow.service import RunView, Started, Workflows
from shoal.workflow.states import RunStatus, StepFailed, StepKind, StepStatus, WorkflowChanged
from shoal.workflow.store import RunRow, StepRow

__all__ = [
    "RunRow",
    "RunStatus",
    "RunView",
    "Started",
    "StepFailed",
    "StepKind",
    "StepRow",
    "StepStatus",
    "Workflow",
    "WorkflowChanged",
    "WorkflowSpec",
    "Workflows",
    "current_workflow",
]
