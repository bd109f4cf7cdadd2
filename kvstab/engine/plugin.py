"""Plug-in rules on the fast engine (see :func:`plugin_path`)."""

from __future__ import annotations

from typing import Any


def plugin_path(scheduler: Any, lifecycle: str) -> tuple[Any, str]:
    """The faster path for a plug-in rule, or ``None`` and the reason there is none."""
    return None, "no fast path for plug-in rules yet"
