"""Testing an application's workflows with gendurable.testing, from Python.

What a test would do, as a script: the application's code inserts work; the
test asserts what was inserted (``assert_inserted``, ``refute_inserted``),
runs the queue to its end in the calling thread (``drain``) and asserts on the
outcome. An engine made with ``inline=True`` runs each insert to its end
before the insert returns. No worker is started.

Run it with a PostgreSQL in DATABASE_URL, or with none (a throwaway cluster is
started from the installed server binaries):

    python examples/python/testing_helpers.py
"""

from __future__ import annotations

import os

import gendurable
import gendurable.testing
from gendurable import Done, Next
from gendurable.testing import assert_inserted, drain, refute_inserted


@gendurable.workflow("Signup")
class Signup:
    def start(self, state, ctx):
        return Next("welcome", {**state, "account": f"acct-{state['email']}"})

    async def welcome(self, state, ctx):
        return Done({**state, "welcomed": True})


def sign_up(engine: gendurable.Engine, email: str) -> int:
    """The application's code: a signup starts its workflow."""
    return engine.insert(Signup, {"email": email})


def main() -> None:
    schema = os.environ.get("EXAMPLE_SCHEMA", "example_testing")
    with gendurable.testing.postgres() as url:
        engine = gendurable.Engine(url, schema=schema, workflows=[Signup])
        sign_up(engine, "ada@example.com")
        assert_inserted(engine, Signup, state={"email": "ada@example.com"}, status="available")
        refute_inserted(engine, Signup, state={"email": "bob@example.com"})

        drained = drain(engine)
        print(f"drained: {drained}")
        assert (drained.steps, drained.completed) == (2, 1)
        done = assert_inserted(engine, Signup, status="completed")
        print(f"completed: {done.state}")

        try:
            assert_inserted(engine, Signup, state={"email": "bob@example.com"})
        except AssertionError as e:
            print(f"as a failing test would say: {e}")
        engine.shutdown()

        inline = gendurable.Engine(url, schema=schema, workflows=[Signup], inline=True)
        id = sign_up(inline, "bob@example.com")
        print(f"inline: the insert returned with the instance {inline.get(id).status}")
        inline.shutdown()


if __name__ == "__main__":
    main()
