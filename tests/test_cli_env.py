"""The CLI's help shows every option's default, and the deployment settings read the environment.

Precedence: the flag, else the environment variable, else the default. A
variable whose value does not parse is one line naming the variable and the
value, exit 2, before anything starts.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

import pytest

from shoal import Shoal
from shoal.cli import ingest_transport, main
from shoal.cli.common import prepare_threshold
from shoal.cli.parse import ENV_SETTINGS, HelpFormatter, apply_environment, parser
from shoal.errors import InvalidInput

ENV_NAMES = sorted({variable for _, _, variable, _, _ in ENV_SETTINGS})


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    root = parser()
    (sub,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    return {"": root, **sub.choices}


def resolved(*argv: str) -> argparse.Namespace:
    args = parser().parse_args(list(argv))
    apply_environment(args)
    return args


def test_every_option_of_every_command_states_its_default() -> None:
    missing = []
    for name, command in subcommands().items():
        formatter = HelpFormatter(prog=f"shoal {name}")
        for action in command._actions:
            if isinstance(
                action,
                argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction,
            ):
                continue
            if action.required or (not action.option_strings and action.nargs is None):
                continue  # required: no default to show
            text = formatter._get_help_string(action) or ""
            if "default" not in text:
                missing.append(f"shoal {name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_the_help_names_each_settings_variable() -> None:
    commands = {name: " ".join(p.format_help().split()) for name, p in subcommands().items()}
    assert "env SHOAL_POOL_SIZE" in commands["worker"]
    assert "env SHOAL_GRACE" in commands["worker"]
    assert "env SHOAL_PORT" in commands["api"]
    assert "env SHOAL_LOG_LEVEL" in commands[""]
    assert "SHOAL_API_TOKEN" in commands["api"]


def test_the_allowed_hosts_come_from_the_flags_else_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolved("api", "--app", "m:a").allowed_hosts == []
    monkeypatch.setenv("SHOAL_API_ALLOWED_HOSTS", " Shoal.example.com , [fd00::1] ,")
    assert resolved("api", "--app", "m:a").allowed_hosts == ["fd00::1", "shoal.example.com"]
    flagged = resolved(
        "api", "--app", "m:a", "--allowed-host", "a.test", "--allowed-host", "B.test"
    )
    assert flagged.allowed_hosts == ["a.test", "b.test"]


def test_defaults_apply_when_neither_flag_nor_variable_is_set() -> None:
    args = resolved("api", "--app", "m:a")
    assert (args.pool_size, args.port, args.host, args.log_level) == (10, 8000, "127.0.0.1", "INFO")
    worker = resolved("worker", "--app", "m:a")
    assert (worker.grace, worker.pool_size) == (30.0, None)  # None: sized to fit the app


def test_a_variable_beats_the_default_and_a_flag_beats_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHOAL_POOL_SIZE", "25")
    monkeypatch.setenv("SHOAL_GRACE", "5")
    monkeypatch.setenv("SHOAL_PORT", "9001")
    monkeypatch.setenv("SHOAL_LOG_LEVEL", "warning")
    monkeypatch.setenv("SHOAL_SCHEMA", "from_env")
    worker = resolved("worker", "--app", "m:a")
    assert (worker.pool_size, worker.grace, worker.log_level) == (25, 5.0, "WARNING")
    assert worker.schema == "from_env"
    api = resolved("api", "--app", "m:a")
    assert (api.pool_size, api.port) == (25, 9001)

    flagged = resolved(
        "--log-level", "debug", "--schema", "flag", "worker", "--app", "m:a", "--pool-size", "3",
        "--grace", "0",
    )  # fmt: skip
    assert (flagged.pool_size, flagged.grace, flagged.log_level) == (3, 0.0, "DEBUG")
    assert flagged.schema == "flag"
    assert resolved("api", "--app", "m:a", "--port", "7000").port == 7000


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "SHOAL_POOL_SIZE",
            "ten",
            "error: SHOAL_POOL_SIZE: must be a whole number >= 1, got 'ten'",
        ),
        ("SHOAL_POOL_SIZE", "0", "error: SHOAL_POOL_SIZE: must be a whole number >= 1, got '0'"),
        ("SHOAL_GRACE", "-1", "error: SHOAL_GRACE: must be a number of seconds >= 0, got '-1'"),
        ("SHOAL_PORT", "70000", "error: SHOAL_PORT: must be a port 0-65535, got '70000'"),
        (
            "SHOAL_API_ALLOWED_HOSTS",
            "shoal.example.com,http://evil.example",
            "error: SHOAL_API_ALLOWED_HOSTS: 'http://evil.example' is not a host name: "
            "give the bare name, as 'shoal.example.com'",
        ),
        (
            "SHOAL_LOG_LEVEL",
            "loud",
            "error: SHOAL_LOG_LEVEL: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, "
            "got 'loud'",
        ),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_and_its_value(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    line: str,
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("COLUMNS", "60")  # a narrow terminal must not wrap the error
    command = ["api", "--app", "m:a"] if variable != "SHOAL_GRACE" else ["worker", "--app", "m:a"]
    assert main(command) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_a_variable_of_another_command_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_GRACE", "not a number")
    args = resolved("status")  # status has no --grace: its variable is not its business
    assert not hasattr(args, "grace")


TRANSPORT_NAMES = (
    "SHOAL_INGEST_TRANSPORT",
    "SHOAL_NATS_URL",
    "SHOAL_NATS_MONITOR_URL",
    "SHOAL_NATS_REPLICAS",
)


def test_the_ingest_transport_is_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.ingest.nats import NatsTransport
    from shoal.ingest.postgres import PostgresTransport

    for name in TRANSPORT_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert ingest_transport() is PostgresTransport  # unset
    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", " ")
    assert ingest_transport() is PostgresTransport  # blank counts as unset
    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", "nats")
    monkeypatch.setenv("SHOAL_NATS_URL", "nats://10.0.0.9:4222")
    monkeypatch.setenv("SHOAL_NATS_MONITOR_URL", "http://10.0.0.9:8222/")
    transport = ingest_transport()(cast(Shoal, None))  # nats needs no client
    assert isinstance(transport, NatsTransport)
    assert transport._servers == ["nats://10.0.0.9:4222"]
    assert transport._monitor_urls == ["http://10.0.0.9:8222"]
    assert transport._replicas == 1


def test_a_nats_cluster_is_every_servers_url_and_the_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shoal.ingest.nats import NatsTransport

    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", "nats")
    monkeypatch.setenv("SHOAL_NATS_URL", "nats://n1:4222, nats://n2:4222,nats://n3:4222")
    monkeypatch.setenv("SHOAL_NATS_MONITOR_URL", "http://n1:8222,http://n2:8222,http://n3:8222")
    monkeypatch.setenv("SHOAL_NATS_REPLICAS", "3")
    transport = ingest_transport()(cast(Shoal, None))
    assert isinstance(transport, NatsTransport)
    assert transport._servers == ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"]
    assert transport._monitor_urls == ["http://n1:8222", "http://n2:8222", "http://n3:8222"]
    assert transport._replicas == 3


@pytest.mark.parametrize("value", ["0", "three", "-1"])
def test_bad_nats_replicas_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", "nats")
    monkeypatch.setenv("SHOAL_NATS_REPLICAS", value)
    with pytest.raises(
        InvalidInput, match=f"SHOAL_NATS_REPLICAS: must be a whole number >= 1, got '{value}'"
    ):
        ingest_transport()


@pytest.mark.parametrize("command", [["worker", "--app", "m:a"], ["topic", "dead", "t"]])
def test_a_bad_ingest_transport_ends_worker_and_topic_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    monkeypatch.setenv("SHOAL_INGEST_TRANSPORT", "bogus")
    monkeypatch.setenv("COLUMNS", "60")
    if command[0] == "worker":
        monkeypatch.setattr("shoal.cli.run.load_app", lambda spec: None)
    assert main(command) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: SHOAL_INGEST_TRANSPORT: must be postgres or nats, got 'bogus'"
    ]


def test_prepared_statements_can_be_turned_off_for_pgbouncer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHOAL_PREPARE_THRESHOLD", raising=False)
    assert prepare_threshold() == 5  # psycopg's own default
    monkeypatch.setenv("SHOAL_PREPARE_THRESHOLD", "off")
    assert prepare_threshold() is None
    monkeypatch.setenv("SHOAL_PREPARE_THRESHOLD", "0")
    assert prepare_threshold() == 0
    monkeypatch.setenv("SHOAL_PREPARE_THRESHOLD", "never")
    with pytest.raises(InvalidInput, match="SHOAL_PREPARE_THRESHOLD: must be 'off' or a whole"):
        prepare_threshold()


async def test_a_pool_without_prepared_statements_prepares_none(db_url: str) -> None:
    from shoal.db import Database

    async with Database(db_url, prepare_threshold=None) as db:

        async def run(conn: Any) -> Any:
            assert conn.prepare_threshold is None
            for _ in range(10):
                await conn.execute("SELECT 1")
            cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
            return (await cur.fetchone())[0]

        assert await db.run(run) == 0
