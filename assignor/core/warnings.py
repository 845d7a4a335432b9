"""Warnings collected while planning, in a deterministic and bounded form."""

from __future__ import annotations

from collections import defaultdict

# A scenario with 10,000 bad claims must not produce a 10,000-line answer.
MAX_PER_KIND = 20


class Warnings:
    """Warnings grouped by kind, in the order kinds were first seen."""

    def __init__(self) -> None:
        self._by_kind: defaultdict[str, list[str]] = defaultdict(list)

    def add(self, kind: str, message: str) -> None:
        self._by_kind[kind].append(message)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_kind.values())

    def render(self) -> list[str]:
        lines: list[str] = []
        for messages in self._by_kind.values():
            unique = list(dict.fromkeys(messages))
            lines.extend(unique[:MAX_PER_KIND])
            if len(unique) > MAX_PER_KIND:
                lines.append(f"... and {len(unique) - MAX_PER_KIND} more like the above")
        return lines
