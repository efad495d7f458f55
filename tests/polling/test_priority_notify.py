"""A new priority item reaches a running poller through its notification, at once,
not at the poller's next periodic re-read of the priority set."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import timedelta

from shoal import Shoal
from shoal_polling.poller import add_priority_item
from tests.conftest import wait_for
from tests.polling.rig import ONCE, open_rig, scalar

# So long that within the test only the notification can deliver a new item.
NEVER = timedelta(days=1)


async def test_a_new_priority_item_reaches_a_running_poller_by_its_notification(
    polling: Shoal,
) -> None:
    rig = await open_rig(polling, settings=dataclasses.replace(ONCE, priority_refresh=NEVER))
    # Nothing due: the poller's rounds find no work until the test says so.
    await scalar(polling, "UPDATE shoal_polling.due SET due_at = now() + interval '1 day'")
    run = asyncio.create_task(rig.poller.run(rig.stop))
    try:
        # Listening, and the set re-read after LISTEN began: the periodic
        # re-read is a day away, so what follows can only come by notification.
        await wait_for(
            lambda: rig.poller.invalidator.listening.is_set() and rig.poller.priority_ready.is_set()
        )
        card = await scalar(polling, "SELECT min(id) FROM shoal_polling.card")
        item = await add_priority_item(polling.db, card, "traffic")
        await wait_for(lambda: rig.poller.priority.get((card, "traffic")) == item)

        # And the next poll of that step applies it, completing the item.
        await scalar(
            polling,
            "UPDATE shoal_polling.due SET due_at = now() WHERE card_id = %s AND step = 'traffic'",
            (card,),
        )
        await wait_for(lambda: rig.poller.stats.priority_applied == 1)
        state = await scalar(
            polling, "SELECT state FROM shoal_polling.priority_item WHERE id = %s", (item,)
        )
        assert state == "done"
        assert (card, "traffic") not in rig.poller.priority
    finally:
        rig.stop.set()
        with contextlib.suppress(Exception):
            await run
        await rig.close()


async def test_items_added_while_nobody_listened_are_found_by_the_re_read(polling: Shoal) -> None:
    rig = await open_rig(polling, settings=dataclasses.replace(ONCE, priority_refresh=NEVER))
    await scalar(polling, "UPDATE shoal_polling.due SET due_at = now() + interval '1 day'")
    card = await scalar(polling, "SELECT min(id) FROM shoal_polling.card")
    item = await add_priority_item(polling.db, card, "card_status")  # before any poller runs
    run = asyncio.create_task(rig.poller.run(rig.stop))
    try:
        await wait_for(lambda: rig.poller.priority_ready.is_set())
        assert rig.poller.priority[(card, "card_status")] == item
    finally:
        rig.stop.set()
        with contextlib.suppress(Exception):
            await run
        await rig.close()
