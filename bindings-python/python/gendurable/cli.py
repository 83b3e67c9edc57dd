"""The ``gendurable`` command: ``gendurable worker module:engine``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Optional

from .engine import Engine


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


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the ``gendurable`` console script."""
    parser = argparse.ArgumentParser(prog="gendurable", description="gendurable for Python")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser(
        "worker",
        help="run a worker node until SIGTERM or Ctrl-C",
        description="Import ENGINE (module:attribute, an Engine or a function returning one)"
        " and run its worker until SIGTERM or Ctrl-C, then shut down gracefully.",
    )
    worker.add_argument("engine", metavar="ENGINE", help="module:attribute, e.g. app.jobs:engine")
    args = parser.parse_args(argv)
    if args.command == "worker":
        engine = _load(args.engine)
        print(
            f"gendurable worker {engine.node_id}: workflows {', '.join(engine.workflows)};"
            " SIGTERM or Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        engine.run()
        print(f"gendurable worker {engine.node_id}: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
