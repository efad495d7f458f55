"""The console: what ``shoal api``'s console routes and pages and the console
commands of ``shoal`` read and control, over every layer's tables.

A layer of its own, above the queue, batch and ingest layers whose tables it
reads and below the API and CLI that show it. Its statements are in
``console.sql``, run only by :class:`~shoal.console.store.ConsoleStore`;
what a layer needs for itself (a job, a page of a queue's jobs, the
schedules, the workers, taking dead letters) it reads through that layer's
store. Private: the API and the command line are its public faces.
"""

__all__: list[str] = []
