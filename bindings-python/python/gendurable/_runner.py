"""Runs step functions for the native node and encodes what they return.

The native side calls :func:`invoke` (sync steps, on a worker thread) and
:func:`invoke_async` (async steps, submitted to the engine's event loop).
Both hand back a plain tuple the native side decodes into a transition.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from typing import Any, Callable, Optional

from .context import Context
from .errors import Error
from .transitions import Discard, Transition

log = logging.getLogger("gendurable")


def _logged(result: tuple, step: str, ctx: tuple) -> tuple:
    """``result``; a step error or a discard is also a warning on the
    ``gendurable`` logger, with the instance in the record's ``gendurable``
    attribute (id, workflow, step, attempt, max_attempts)."""
    kind = result[0]
    if kind in ("error", "discard") and log.isEnabledFor(logging.WARNING):
        instance, workflow, _queue, attempt, max_attempts = ctx[:5]
        what = "failed" if kind == "error" else "discarded its instance"
        log.warning(
            "%s step %r of instance %s %s (attempt %s of %s): %s",
            workflow,
            step,
            instance,
            what,
            attempt,
            max_attempts,
            result[1],
            extra={
                "gendurable": {
                    "id": instance,
                    "workflow": workflow,
                    "step": step,
                    "attempt": attempt,
                    "max_attempts": max_attempts,
                }
            },
        )
    return result


def _error(reason: str, detail: Optional[str]) -> tuple:
    return ("error", reason, detail)


def _raised(exc: BaseException) -> tuple:
    if isinstance(exc, Discard):
        return encode(exc)
    if isinstance(exc, Error):
        reason = exc.message or type(exc).__name__
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return _error(reason, traceback.format_exc())


def encode(out: Any) -> tuple:
    """A step's return value as the tuple the native side decodes. A
    :class:`Discard`, both a transition and an ``Error``, is its transition."""
    if isinstance(out, Transition):
        try:
            return out._encode()
        except Exception as exc:
            return _raised(exc)
    if isinstance(out, Error):
        return _error(out.message or type(out).__name__, out.detail)
    if isinstance(out, BaseException):
        detail = "".join(traceback.format_exception(type(out), out, out.__traceback__))
        return _error(f"{type(out).__name__}: {out}", detail if out.__traceback__ else None)
    return _error(
        f"the step returned {out!r}; expected Next, Done, Await, Snooze, Error, Discard or Cancel",
        None,
    )


def invoke(fn: Callable[..., Any], takes_step: bool, step: str, state: Any, ctx: tuple) -> tuple:
    """Run a sync step function and encode its outcome."""
    try:
        c = Context._from_native(ctx)
        out = fn(step, state, c) if takes_step else fn(state, c)
        # A transition first: inspect.isawaitable is a tenth of this call.
        if not isinstance(out, Transition) and inspect.isawaitable(out):
            out = asyncio.run(_await(out))
    except BaseException as exc:
        return _logged(_raised(exc), step, ctx)
    return _logged(encode(out), step, ctx)


async def _await(aw: Any) -> Any:
    return await aw


async def _run(
    fn: Callable[..., Any], takes_step: bool, step: str, state: Any, ctx: tuple
) -> tuple:
    try:
        c = Context._from_native(ctx)
        out = fn(step, state, c) if takes_step else fn(state, c)
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:
        return _logged(_raised(exc), step, ctx)
    return _logged(encode(out), step, ctx)


def invoke_async(
    fn: Callable[..., Any],
    takes_step: bool,
    step: str,
    state: Any,
    ctx: tuple,
    loop: asyncio.AbstractEventLoop,
    done: Callable[[Any], None],
) -> Any:
    """Submit an async step to ``loop``; ``done`` is called with the future."""
    fut = asyncio.run_coroutine_threadsafe(_run(fn, takes_step, step, state, ctx), loop)
    fut.add_done_callback(done)
    return fut
