"""Django (its PostgreSQL backend on psycopg 3) enqueues in its own transaction."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from shoal import Job, Shoal, SyncClient
from shoal.testing import drain

django = pytest.importorskip("django")


def configure_django(url: str) -> None:
    """A settings module of one database, made in place (no project needed)."""
    from django.conf import settings  # type: ignore[import-untyped]  # Django ships no types

    info = conninfo_to_dict(url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info["dbname"],
        "USER": info.get("user", ""),
        "HOST": info.get("host", ""),
        "PORT": info.get("port", ""),
    }
    if not settings.configured:
        settings.configure(DATABASES={"default": database}, INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
    else:  # a second test in this process: point the connection at its database
        from django.db import connections  # type: ignore[import-untyped]  # no types

        connections["default"].close()
        connections["default"].settings_dict.update(database)


def test_django_enqueues_in_transaction_atomic_and_a_rollback_enqueues_nothing(
    db_url: str,
) -> None:
    configure_django(db_url)
    from django.db import connection, transaction  # type: ignore[import-untyped]  # no types

    ran: list[int] = []
    with SyncClient.connect(db_url, min_size=0, max_size=1) as shoal:
        try:
            connection.ensure_connection()
            assert isinstance(connection.connection, psycopg.Connection)
            with pytest.raises(RuntimeError), transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("CREATE TABLE signup (email text PRIMARY KEY)")
                shoal.send("welcome", {"email": "a@example.com"}, conn=connection.connection)
                raise RuntimeError("the view failed after enqueueing")
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("CREATE TABLE signup (email text PRIMARY KEY)")
                    cursor.execute("INSERT INTO signup VALUES ('b@example.com')")
                job_id = shoal.send(
                    "welcome", {"email": "b@example.com"}, conn=connection.connection
                )
            assert job_id is not None
            # Django's own queries still read its way (jsonb as text): shoal's
            # cursor did not change the connection's adapters.
            with connection.cursor() as cursor:
                cursor.execute("SELECT data FROM shoal.job")
                assert cursor.fetchall() == [('{"email": "b@example.com"}',)]
        finally:
            connection.close()

    async def work() -> int:
        async with await Shoal.connect(db_url, listen=False) as boss:

            def welcome(job: Job) -> None:
                ran.append(job.id)

            result = await drain(boss, "welcome", welcome)
            return result.completed

    assert asyncio.run(work()) == 1
    assert ran == [job_id]
