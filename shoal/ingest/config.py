"""Run-time configuration in the database, read through a short cache.

``shoal config set ingest.mode async`` takes effect in every process within
the cache's lifetime (5 s by default) without a restart. A failed read serves
the last value this process saw (and the default before any), so a database
hiccup never flips a switch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shoal.clock import SYSTEM_CLOCK, Clock
from shoal.errors import InvalidInput
from shoal.ingest.store import IngestStore

log = logging.getLogger("shoal.ingest.config")

DEFAULT_CACHE_TTL = timedelta(seconds=5)
MODES = ("sync", "async")
# The switch a pipeline reads its mode from (a pipeline may prefix its own).
MODE_KEY = "ingest.mode"
# The reference's: switch to async once the deployment is confirmed.
DEFAULT_MODE = "sync"
# The keys shoal itself reads, with the value each has until it is set
# (a pipeline's own <prefix>.ingest.mode defaults as ingest.mode does).
DEFAULTS: dict[str, Any] = {MODE_KEY: DEFAULT_MODE}
# What an operator's ``set`` of an unknown key is told (``shoal config set``).
NEW_KEY_HINT = "pass --new to create a new key"


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """A key's value as processes see it: the stored one, else its default."""

    key: str
    value: Any
    # When it was set; None for a key never set, which has its default.
    set_at: datetime | None


class RuntimeConfig:
    def __init__(
        self, store: IngestStore, *, ttl: timedelta = DEFAULT_CACHE_TTL, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[str, tuple[Any, float]] = {}
        self._reading: dict[str, asyncio.Task[Any]] = {}

    async def get(self, key: str, default: Any = None) -> Any:
        cached = self._cache.get(key)
        if cached is not None and self.clock.monotonic() - cached[1] < self.ttl.total_seconds():
            return default if cached[0] is None else cached[0]
        # One read per key at a time: hundreds of producers whose cache ran out
        # together share it instead of each taking a connection.
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.create_task(self._read(key, cached))
            self._reading[key] = reading
            reading.add_done_callback(lambda task: self._forget(key, task))
        value = await asyncio.shield(reading)
        return default if value is None else value

    async def _read(self, key: str, cached: tuple[Any, float] | None) -> Any:
        try:
            value = await self.store.config_get(key)
        except Exception as exc:
            log.warning("config %s: read failed (%s); keeping the last value", key, exc)
            return None if cached is None else cached[0]
        if self._reading.get(key) is asyncio.current_task():  # not overtaken by a set()
            self._cache[key] = (value, self.clock.monotonic())
        return value

    def _forget(self, key: str, task: asyncio.Task[Any]) -> None:
        if self._reading.get(key) is task:
            del self._reading[key]

    async def entries(self) -> list[ConfigEntry]:
        """Every known key, read now (no cache): the stored ones and the defaults of the
        keys shoal reads that were never set, by key."""
        stored = {
            key: ConfigEntry(key, value, at) for key, value, at in await self.store.config_all()
        }
        defaults = {key: ConfigEntry(key, value, None) for key, value in DEFAULTS.items()}
        merged = defaults | stored
        return [merged[key] for key in sorted(merged)]

    async def entry(self, key: str) -> ConfigEntry:
        """``key``'s value read now (no cache): stored, else its default; InvalidInput
        naming the known keys when ``key`` is neither stored nor one shoal reads."""
        entries = {e.key: e for e in await self.entries()}
        if key in entries:
            return entries[key]
        check_key_exists(key, entries, hint="")
        return ConfigEntry(key, default_of(key), None)

    async def set(self, key: str, value: Any) -> None:
        check_config(key, value)
        await self.store.config_set(key, value, now=self.clock.sql_now())
        self._cache.pop(key, None)
        self._reading.pop(key, None)  # a read already under way may predate the write


def is_mode_key(key: str) -> bool:
    """``ingest.mode``, or a pipeline's own mode key (``<prefix>.ingest.mode``)."""
    return key == MODE_KEY or key.endswith(f".{MODE_KEY}")


def default_of(key: str) -> Any:
    """The value ``key`` has until it is set (None for an application's own key)."""
    return DEFAULT_MODE if is_mode_key(key) else DEFAULTS.get(key)


def check_config(key: str, value: Any) -> None:
    """Known keys are checked: a typo must not silently switch a pipeline."""
    if not isinstance(key, str) or not 1 <= len(key) <= 200 or "\x00" in key:
        raise InvalidInput("key", "a config key is 1-200 characters")
    if is_mode_key(key) and value not in MODES:
        raise InvalidInput(key, f"must be one of {', '.join(MODES)}; got {value!r}")


def check_key_exists(key: str, stored: Iterable[str], *, hint: str = NEW_KEY_HINT) -> None:
    """For an operator's ``set`` or ``get``: ``key`` is a mode key, a key shoal reads or
    one already stored (an application's own setting, written by the application
    first). Anything else is almost surely a typo (``ingest.mdoe``), refused listing
    the known keys; ``shoal config set --new`` creates a key deliberately."""
    known = sorted({*DEFAULTS, *stored})
    if not is_mode_key(key) and key not in known:
        raise InvalidInput(
            "key",
            f"unknown config key {key!r}; known keys: {', '.join(known)} (or a pipeline's "
            f"own <prefix>.{MODE_KEY})" + (f"; {hint}" if hint else ""),
        )
