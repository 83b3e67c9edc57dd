"""Small helpers for the native module."""

from __future__ import annotations

from typing import Any


async def _value(v: Any) -> Any:
    return v


def ready(v: Any) -> Any:
    """An awaitable that gives ``v``."""
    return _value(v)
