"""Both consumers take their shared options from one declaration, and refuse any other."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.ingest.batch_consumer import BatchConsumer
from shoal.ingest.consumer import Consumer
from shoal.ingest.consumer_base import ConsumerOptions
from shoal.ingest.message import Message, Topic

TOPIC: Topic[Any] = Topic("options.readings")


async def apply(message: Message[Any]) -> None:
    pass


async def write(messages: list[Message[Any]]) -> None:
    pass


@pytest.mark.parametrize("make", [Consumer, BatchConsumer], ids=["consumer", "batch"])
def test_a_misspelt_option_is_refused_by_name_not_ignored(make: Any) -> None:
    handler = apply if make is Consumer else write
    with pytest.raises(TypeError, match="'retry_limt'"):
        make(object(), TOPIC, handler, store=object(), retry_limt=3)


def test_the_shared_options_are_the_ones_both_consumers_document() -> None:
    assert ConsumerOptions.__optional_keys__ == {
        "group",
        "retryable",
        "retry_limit",
        "max_attempts",
        "ladder",
        "ack_wait",
        "poll",
        "clock",
        "hooks",
    }
