"""What ``shoal topic``, ``shoal config`` and ``shoal --version`` answer is true.

``topic dead nosuch`` printed an empty table and ``topic redrive nosuch``
"published 0", both with exit 0; ``config list`` printed nothing and
``config get ingest.mode`` printed ``null`` though ``sync`` is the default;
there was no ``--version`` (issue 35, item 9).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shoal import Shoal
from shoal.cli import main
from shoal.ingest.message import new_envelope
from shoal.ingest.store import IngestStore
from tests.cli_helpers import shoal, with_boss


async def dead_letter(boss: Shoal) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    envelope = new_envelope({"n": 1}, published_at=at, id="m1").encode().decode()
    letters = [("m1", envelope, "ValueError: bad row", 3)]
    await IngestStore(boss.db).dead_letter("cards", "attempts", letters, now=None)


@pytest.mark.parametrize("action", ["dead", "redrive"])
def test_topic_commands_refuse_an_unknown_topic_naming_the_known_ones(
    db_url: str, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_boss(db_url, dead_letter)
    assert shoal(db_url, "topic", action, "nosuch") == 2
    assert capsys.readouterr().err.strip() == "error: no topic 'nosuch'; known topics: cards"
    # The known topic's dead letter is still there, waiting for a redrive.
    letters = with_boss(db_url, lambda boss: IngestStore(boss.db).dead_letters("cards"))
    assert [letter.message_id for letter in letters] == ["m1"]
    assert shoal(db_url, "topic", "dead", "cards") == 0
    assert "m1" in capsys.readouterr().out


def test_config_list_shows_every_key_with_its_value_and_where_it_came_from(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shoal(db_url, "config", "list") == 0
    assert capsys.readouterr().out.splitlines() == ['ingest.mode = "sync"  (default)']

    assert shoal(db_url, "config", "set", "polling.plan_interval_s", "30", "--new") == 0
    assert shoal(db_url, "config", "set", "ingest.mode", "async") == 0
    capsys.readouterr()
    assert shoal(db_url, "config", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.partition("  (")[0] for line in lines] == [
        'ingest.mode = "async"',
        "polling.plan_interval_s = 30",
    ]
    for line in lines:
        at = line.partition("  (set ")[2].removesuffix(")")
        assert datetime.fromisoformat(at).tzinfo is not None, line


def test_config_get_prints_the_value_in_effect_and_refuses_an_unknown_key(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shoal(db_url, "config", "get", "ingest.mode") == 0
    assert json.loads(capsys.readouterr().out) == "sync"  # the default, never set
    assert shoal(db_url, "config", "get", "cards.ingest.mode") == 0
    assert json.loads(capsys.readouterr().out) == "sync"  # a pipeline's own, as its default
    assert shoal(db_url, "config", "set", "ingest.mode", "async") == 0
    capsys.readouterr()
    assert shoal(db_url, "config", "get", "ingest.mode") == 0
    assert json.loads(capsys.readouterr().out) == "async"

    assert shoal(db_url, "config", "get", "ingest.mdoe") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "error: key: unknown config key 'ingest.mdoe'; known keys: ingest.mode "
        "(or a pipeline's own <prefix>.ingest.mode)"
    )


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"shoal {version('shoal')}"
