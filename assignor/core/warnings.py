"""Warnings collected while planning, in a deterministic and bounded form."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

# A scenario with 10,000 bad claims must not produce a 10,000-line answer.
MAX_PER_KIND = 20
# A bad value is shown up to this many characters (it may be a megabyte of garbage).
MAX_SHOWN = 80
_MAX_DEPTH = 8


def shown(value: Any) -> str:
    """A value as a warning shows it: the same text whatever the order of its keys and items."""
    text = canonical(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def canonical(value: Any, depth: int = 0) -> str:
    """repr() with every object's items and every list's items sorted (lists are sets here)."""
    if depth > _MAX_DEPTH and isinstance(value, Mapping | list | tuple):
        return "{...}" if isinstance(value, Mapping) else "[...]"
    if isinstance(value, Mapping):
        items = sorted(f"{canonical(k, depth + 1)}: {canonical(v, depth + 1)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(sorted(canonical(v, depth + 1) for v in value)) + "]"
    return repr(value)


def key_order(key: Any) -> tuple[str, str, str]:
    """Sort key for JSON object keys: by text (JSON keys are strings), then type, for other callers."""
    return (str(key), type(key).__name__, canonical(key))


# A capped kind's summary line names the members it hides, up to this many.
MAX_HIDDEN_NAMED = 100


class Warnings:
    """Warnings grouped by kind, in the order kinds were first seen.

    Each member field has a kind of its own, so one member's odd field is never
    hidden behind twenty other members' odd subscriptions; when a kind is capped,
    the summary line still names the members whose warnings it leaves out.
    """

    def __init__(self) -> None:
        self._by_kind: defaultdict[str, list[tuple[str, str | None]]] = defaultdict(list)

    def add(self, kind: str, message: str) -> None:
        self._by_kind[kind].append((message, None))

    def member(self, member_id: str, field: str, message: str) -> None:
        """A warning about one field of one member (the message names both)."""
        self._by_kind[f"member {field}"].append((message, member_id))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_kind.values())

    def render(self) -> list[str]:
        lines: list[str] = []
        for messages in self._by_kind.values():
            unique = list(dict.fromkeys(messages))
            lines.extend(message for message, _ in unique[:MAX_PER_KIND])
            hidden = unique[MAX_PER_KIND:]
            if hidden:
                lines.append(f"... and {len(hidden)} more like the above" + _naming(hidden))
        return lines


def _naming(hidden: list[tuple[str, str | None]]) -> str:
    members = sorted({m for _, m in hidden if m is not None})
    if not members:
        return ""
    named = ", ".join(map(repr, members[:MAX_HIDDEN_NAMED]))
    more = f" and {len(members) - MAX_HIDDEN_NAMED} others" if len(members) > MAX_HIDDEN_NAMED else ""
    return f", for members {named}{more}"
