"""A small application, as a user would write it: its workflows are declared
with ``gendurable.workflow`` and its code inserts them. Tested by
tests/test_testing.py with the helpers of ``gendurable.testing``."""

from __future__ import annotations

import gendurable
from gendurable import Discard, Done, Next


@gendurable.workflow("Shop.Order", queue="orders", max_attempts=3)
class Order:
    def start(self, state, ctx):
        if state["cents"] <= 0:
            raise Discard("nothing to charge")
        return Next("receipt", {**state, "charged": state["cents"]})

    async def receipt(self, state, ctx):
        return Done({**state, "receipt": f"R-{state['order']}"})


@gendurable.workflow("Shop.Mail")
def mail(step, state, ctx):
    return Done({**state, "sent": True})


def engine(url: str, schema: str, **options) -> gendurable.Engine:
    return gendurable.Engine(
        url,
        schema=schema,
        queues={"default": 5, "orders": 5},
        workflows=[Order, mail],
        **options,
    )


def place_order(engine: gendurable.Engine, order: int, cents: int, email: str) -> int:
    """Insert the order's workflow and its confirmation mail."""
    id = engine.insert(Order, {"order": order, "cents": cents})
    engine.insert(mail, {"to": email, "order": order, "template": "confirmation"})
    return id
