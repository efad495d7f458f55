"""``create_api``: the FastAPI app over one :class:`Shoal` and its :class:`Batches`.

>>> boss = await Shoal.connect(url)                                  # doctest: +SKIP
>>> api = create_api(boss, app.batches(boss), token=os.environ.get("SHOAL_API_TOKEN"))
>>> await uvicorn.Server(uvicorn.Config(api, host="127.0.0.1")).serve()  # doctest: +SKIP

The caller owns ``boss``: the API opens and closes nothing, so one process can
serve the API and run workers on the same pool (as ``shoal demo`` does).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Depends, FastAPI

from shoal.api.auth import refuse_writes, require_token
from shoal.api.console import (
    LazyTransport,
    TransportSource,
    history_router,
    jobs_router,
    queues_router,
    schedules_router,
    topics_router,
    workers_router,
)
from shoal.api.cross_site import CrossSiteGuard
from shoal.api.dashboard import dashboard_router
from shoal.api.errors import install_error_handlers
from shoal.api.hosts import allowed_host_names
from shoal.api.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_REQUEST_DEADLINE_S, RequestLimits
from shoal.api.metrics import metrics_router
from shoal.api.queue_limits import limits_router
from shoal.api.status import health_router, ready_router
from shoal.api.storable import refuse_unstorable_params
from shoal.api.tasks import tasks_router
from shoal.api.workflows import workflows_router
from shoal.batch.service import Batches
from shoal.batch.states import TaskStatus
from shoal.console.history import History
from shoal.console.queues import QueueInspector
from shoal.console.topics import TopicInspector
from shoal.db.writes import CachedWriteCheck
from shoal.errors import InvalidInput
from shoal.ingest.postgres import PostgresTransport
from shoal.queue.client import Shoal
from shoal.queue.registry import WorkerRegistry
from shoal.workflow.service import Workflows

API_VERSION = "1"
# The overview counts open tasks up to this many (it says "500" for more).
OPEN_TASKS_SHOWN = 500


def create_api(
    boss: Shoal,
    batches: Batches,
    *,
    token: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S,
    read_only: bool = False,
    transport: TransportSource | None = None,
    allowed_hosts: Sequence[str] = (),
    workflows: Workflows | None = None,
) -> FastAPI:
    """The HTTP API: ``/v1`` routes, ``/metrics``, health, and the dashboard at ``/``.

    With ``token`` set, ``/v1/*`` and ``/metrics`` need ``Authorization: Bearer
    <token>``; ``/healthz``, ``/readyz``, ``/`` and ``/openapi.json`` stay
    open. Bodies over ``max_body_bytes`` are answered 413, bodies not in after
    ``request_deadline_s`` 408. The OpenAPI document is at ``/openapi.json``.
    With ``read_only`` every ``/v1`` route that would change something answers
    403. A topic redrive publishes on ``transport()`` (default: the postgres
    transport over ``boss``).

    Every route, an application's own included, refuses what a web page on
    another site could make a browser send (:mod:`shoal.api.cross_site`): a
    request whose ``Host`` is not a loopback name, the address it arrived on,
    or one of ``allowed_hosts`` (421), and a write from another origin or one
    a form could send (403).

    ``workflows`` (``app.workflows(boss)``) serves ``/v1/workflows``: without
    it the routes still list, show, cancel and retry runs and send events, but
    start none (no workflow is declared).
    """
    if token is not None and not token.strip():
        raise InvalidInput("token", "must be None or a non-empty string")
    if isinstance(allowed_hosts, str):
        raise InvalidInput("allowed_hosts", f"must be a list of names, got {allowed_hosts!r}")
    host_names = allowed_host_names(allowed_hosts)
    api = FastAPI(
        title="shoal",
        version=API_VERSION,
        summary="Batch tasks and queues on Postgres: create, watch, cancel, retry.",
        docs_url="/docs",
        redoc_url=None,
    )
    install_error_handlers(api)
    # For an application's own routes (App.on_api hooks): they refuse writes too.
    api.state.read_only = read_only
    auth = [Depends(require_token(token))]
    queues = QueueInspector(boss)

    v1 = APIRouter(
        prefix="/v1",
        dependencies=[*auth, Depends(refuse_writes(read_only)), Depends(refuse_unstorable_params)],
    )
    v1.include_router(tasks_router(batches))
    runs = workflows or Workflows(boss, {})
    v1.include_router(workflows_router(runs))
    v1.include_router(queues_router(queues))
    v1.include_router(jobs_router(queues))
    v1.include_router(schedules_router(queues))
    topics = TopicInspector(boss)
    registry = WorkerRegistry(boss)
    v1.include_router(
        topics_router(topics, transport or LazyTransport(lambda: PostgresTransport(boss)), registry)
    )
    v1.include_router(workers_router(registry))
    v1.include_router(limits_router(boss))

    async def open_tasks() -> int:
        return len(await batches.tasks(status=TaskStatus.PROCESSING, limit=OPEN_TASKS_SHOWN))

    # One probe for /readyz and the console: a burst of either makes one write.
    writes = CachedWriteCheck(boss.db, clock=boss.clock)
    v1.include_router(history_router(queues, topics, registry, History(boss), open_tasks, writes))
    api.include_router(v1)
    api.include_router(metrics_router(boss, batches, runs), dependencies=auth)
    api.include_router(health_router())
    api.include_router(ready_router(writes))
    api.include_router(dashboard_router())

    # Outermost of the app's own middleware, so a refused body never reaches a route.
    api.add_middleware(
        RequestLimits,
        max_body_bytes=max_body_bytes,
        request_deadline_s=request_deadline_s,
    )
    # Outside the limits: a refused request is answered from its head alone,
    # and no route (nor an application's own, added later) can be left out.
    api.add_middleware(CrossSiteGuard, allowed_hosts=host_names)
    return api


__all__ = ["create_api"]
