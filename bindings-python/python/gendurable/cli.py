"""The ``gendurable`` command: the same verbs as the Rust CLI (``migrate``,
``status``, ``insert``, ``get``, ``echo``, ``demo``, ``bench``...), which the
extension module runs, plus ``worker``, which runs the worker of a Python
engine: ``gendurable worker module:engine``."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, Optional

from . import _gendurable
from .engine import Engine

__all__ = ["main"]

_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def _load(spec: str) -> Engine:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"gendurable: expected module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Engine) and callable(obj):
        obj = obj()
    if not isinstance(obj, Engine):
        raise SystemExit(f"gendurable: {spec} is not a gendurable.Engine (got {obj!r})")
    return obj


def _worker(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gendurable worker",
        description="Import ENGINE (module:attribute, an Engine or a function returning one)"
        " and run its worker until SIGTERM or Ctrl-C, then shut down gracefully. A second"
        " SIGTERM or Ctrl-C stops the running steps at once (each recorded as an error).",
    )
    parser.add_argument("engine", metavar="ENGINE", help="module:attribute, e.g. app.jobs:engine")
    args = parser.parse_args(list(argv))
    engine = _load(args.engine)
    print(
        f"gendurable worker {engine.node_id}: workflows {', '.join(engine.workflows)};"
        " SIGTERM or Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    try:
        engine.run()
    except KeyboardInterrupt:
        print(
            f"gendurable worker {engine.node_id}: stopped at once; the steps still running"
            " are recorded as errors",
            file=sys.stderr,
            flush=True,
        )
        return _leave(_INTERRUPTED)
    print(f"gendurable worker {engine.node_id}: stopped", file=sys.stderr, flush=True)
    return _leave(0)


def _leave(status: int) -> int:
    """``status``, or, while the function of a ``def`` step stopped by the
    shutdown still runs on its thread, an exit now: ending the interpreter
    under that thread would crash it."""
    if _gendurable.running_sync_steps():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _ignore(signum: int, frame: Any) -> None:
    """Python's part of a SIGINT the Rust CLI handles: nothing to do."""


def _rust(argv: Sequence[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    previous = None
    if threading.current_thread() is threading.main_thread():
        # The CLI handles Ctrl-C (a clean stop, exit status 130); Python must
        # not raise KeyboardInterrupt for it afterwards.
        previous = signal.signal(signal.SIGINT, _ignore)
    try:
        return _gendurable.cli_main(["gendurable", *argv])
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``gendurable`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "worker":
        return _worker(args[1:])
    return _rust(args)


if __name__ == "__main__":
    sys.exit(main())
