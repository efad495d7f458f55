"""Send arguments made into validated jobs: the one place both clients check what they send.

``Shoal`` (async) and ``SyncClient`` (sync) hold a :class:`JobBuilder` and
differ only in how they run the insert: the options are checked by
``parse_options``, the payload by ``encode_payload``, and jobs sent alike
share one :class:`JobSettings`, whichever client sends them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shoal.errors import InvalidInput
from shoal.queue.limits import Partitioner, partition_key_of
from shoal.queue.options import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    QUEUE_DEFAULT_NAMES,
    JobOptions,
    check_queue_name,
    encode_payload,
    parse_options,
)
from shoal.queue.rows import JobSettings, NewJob
from shoal.tracing import with_carrier

MAX_INSERT = 100_000
SETTINGS_CACHE_SIZE = 1024


class JobBuilder:
    """Validates sends and builds :class:`NewJob` rows.

    ``defaults`` fill what a send leaves out, below the queue's stored
    defaults (``Shoal.set_queue_defaults``): the insert statement prefers a
    queue's stored default to any option the send did not name.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        defaults: JobOptions | None = None,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.defaults = defaults or JobOptions()
        # JobSettings by (queue, options): jobs sent alike share one object.
        # Written and read by the client's caller only (one event loop, or
        # one thread at a time for the sync client: a race only rebuilds one).
        self._settings: dict[tuple[Any, ...], JobSettings] = {}
        # partition_by functions of queues whose limits this client declared:
        # the keys of the jobs it sends to them (a field is read by the insert).
        self.partitioners: dict[str, Partitioner] = {}

    def job(
        self,
        queue: object,
        data: object,
        options: Mapping[str, Any],
        field: str = "",
        trace: Mapping[str, str] | None = None,
        *,
        template: bool = False,
    ) -> NewJob:
        """One validated job; errors name ``field`` + the option (``jobs[3].retry_limit``).

        A ``template`` (the options shared by many payloads) gets no
        partition key from a ``partition_by`` function: its caller keys each
        payload.
        """
        try:
            return self._job(queue, data, options, trace, template)
        except InvalidInput as exc:
            if not field:
                raise
            raise InvalidInput(f"{field}{exc.field}", exc.message) from None

    def _job(
        self,
        queue: object,
        data: object,
        options: Mapping[str, Any],
        trace: Mapping[str, str] | None,
        template: bool,
    ) -> NewJob:
        """:meth:`job` with errors naming the option alone: an insert of 10,000
        jobs builds the names of their fields only for the one that fails."""
        name = check_queue_name(queue)
        if trace is not None:
            data = with_carrier(data, trace)
        parsed = parse_options(options) if options else {}
        payload = encode_payload(data, max_bytes=self.max_payload_bytes)
        singleton_key = parsed.pop("singleton_key", self.defaults.singleton_key)
        partition_key = parsed.pop("partition_key", self.defaults.partition_key)
        cost = parsed.pop("cost", self.defaults.cost)
        cost = None if cost == 1 else cost  # 1 is the column's default: nothing to send
        if partition_key is None and not template and name in self.partitioners:
            partition_key = self.partition_key(name, data, "")
        key = (name, *sorted(parsed.items())) if parsed else (name,)
        settings = self._settings.get(key)
        if settings is None:
            settings = self._settings[key] = JobSettings.of(
                name,
                replace(self.defaults, **parsed),
                given=frozenset(parsed) & QUEUE_DEFAULT_NAMES,
            )
            if len(self._settings) > SETTINGS_CACHE_SIZE:
                self._settings.pop(next(iter(self._settings)))
        return NewJob(settings, payload, singleton_key, partition_key, cost)

    def partition_key(self, queue: str, data: object, field: str) -> str:
        """The key this client's ``partition_by`` function gives a job of ``queue``."""
        try:
            key = self.partitioners[queue](data)
        except Exception as exc:
            raise InvalidInput(
                f"{field}data", f"the partition_by function of queue {queue!r} failed: {exc!r}"
            ) from exc
        return partition_key_of(key, field=f"{field}partition_key")

    def jobs(
        self, specs: Iterable[Mapping[str, Any]], trace: Mapping[str, str] | None = None
    ) -> list[NewJob]:
        """The jobs of ``insert([{"queue", "data", **options}, ...])``, all validated first."""
        new_jobs: list[NewJob] = []
        # The first job of each queue sent with its data alone: a later spec of
        # that queue and data alone shares its settings (10,000 jobs of one
        # queue are the common insert), and only its payload is left to check.
        plain: dict[str, NewJob] = {}
        for i, spec in enumerate(specs):
            if len(new_jobs) == MAX_INSERT:
                raise InvalidInput("jobs", f"more than {MAX_INSERT} jobs in one insert")
            try:
                new_jobs.append(self._spec_job(spec, trace, plain))
            except InvalidInput as exc:
                field = f"jobs[{i}].{exc.field}" if exc.field else f"jobs[{i}]"
                raise InvalidInput(field, exc.message) from None
        return new_jobs

    def _spec_job(
        self, spec: object, trace: Mapping[str, str] | None, plain: dict[str, NewJob]
    ) -> NewJob:
        """One spec of :meth:`jobs`, its errors naming the field within the spec."""
        if not (type(spec) is dict or isinstance(spec, Mapping)):
            raise InvalidInput("", f"expected a mapping, got {type(spec).__name__}")
        if "queue" not in spec:
            raise InvalidInput("queue", "missing")
        queue = spec["queue"]
        alone = len(spec) == 1 or (len(spec) == 2 and "data" in spec)
        template = plain.get(queue) if alone and type(queue) is str else None
        if template is not None:
            payload = encode_payload(spec.get("data"), max_bytes=self.max_payload_bytes)
            settings, _, key, partition_key, cost = template
            return NewJob(settings, payload, key, partition_key, cost)
        options = {} if alone else {k: v for k, v in spec.items() if k not in ("queue", "data")}
        new_job = self._job(queue, spec.get("data"), options, trace, False)
        # Not shared for a queue whose keys come from a partition_by function,
        # nor with a trace to add to each payload.
        if alone and trace is None and new_job.settings.queue not in self.partitioners:
            plain.setdefault(new_job.settings.queue, new_job)
        return new_job

    def many(
        self,
        queue: str,
        payloads: Sequence[Any],
        options: Mapping[str, Any],
        *,
        singleton_keys: Sequence[str | None] | None = None,
        partition_keys: Sequence[str | None] | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> list[NewJob]:
        """The jobs of ``insert_many``: options checked once, each payload on its own.

        ``partition_keys`` gives each job its own key (None: as if none were
        sent), in place of the ``partition_key`` option.
        """
        if singleton_keys is not None and len(singleton_keys) != len(payloads):
            raise InvalidInput(
                "singleton_keys",
                f"has {len(singleton_keys)} keys for {len(payloads)} payloads",
            )
        if partition_keys is not None:
            if len(partition_keys) != len(payloads):
                raise InvalidInput(
                    "partition_keys",
                    f"has {len(partition_keys)} keys for {len(payloads)} payloads",
                )
            if "partition_key" in options:
                raise InvalidInput(
                    "partition_key", "give partition_keys=[...] or one key, not both"
                )
        if len(payloads) > MAX_INSERT:
            raise InvalidInput("payloads", f"more than {MAX_INSERT} jobs in one insert")
        if "singleton_key" in options:
            raise InvalidInput("singleton_key", "use singleton_keys=[...] with insert_many")
        template = self.job(queue, None, options, template=True)
        keys = singleton_keys or [None] * len(payloads)
        for i, key in enumerate(keys):
            if key is not None and (not isinstance(key, str) or not key or "\x00" in key):
                raise InvalidInput(f"singleton_keys[{i}]", "must be a non-empty string")
        given = [
            None if key is None else partition_key_of(key, field=f"partition_keys[{i}]")
            for i, key in enumerate(partition_keys or ())
        ]
        by_function = template.partition_key is None and queue in self.partitioners

        def partition_key(i: int, payload: object) -> str | None:
            if given and given[i] is not None:
                return given[i]
            if by_function:
                return self.partition_key(queue, payload, f"payloads[{i}].")
            return template.partition_key

        return [
            NewJob(
                template.settings,
                encode_payload(
                    payload if trace is None else with_carrier(payload, trace),
                    max_bytes=self.max_payload_bytes,
                    field=f"payloads[{i}]",
                ),
                key,
                partition_key(i, payload),
                template.cost,
            )
            for i, (payload, key) in enumerate(zip(payloads, keys, strict=True))
        ]

    def check_payload_sizes(self, payloads: Sequence[str]) -> None:
        """Refuse, by position, a JSON payload text over the payload cap."""
        for i, text in enumerate(payloads):
            if len(text) > self.max_payload_bytes:
                raise InvalidInput(f"payloads[{i}]", f"over the {self.max_payload_bytes}-byte cap")
