"""A peer's `/tandem/` view, checked before the group page uses it.

The group page (group_page.py) puts together the views other members serve. A member is
another process, maybe a broken or hostile one, so its view is input like any record: it is
read up to `MAX_VIEW_BYTES`, parsed as plain JSON (no NaN or Infinity, bounded nesting), and
every field the page reads is checked for its type and size before the page sees it. A
partition count is believed only up to what the group's own assignment says the join's
topics have. A view that fails is `UnreadableView`, with a short reason naming the field:
the page shows that member as "unreadable", never an error page. Fields the page does not
read (what-if's `member` and `planner`) pass through as they came, within the byte bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

MAX_VIEW_BYTES = 4 * 1024 * 1024  # a worker holding 10,000 partitions serves well under 1 MB
MAX_PARTITIONS = 100_000  # per join, when the assignment does not say (the planner's tested scale)
MAX_JOINS = 256
MAX_LIST = 1_000  # history samples, rebalances, ... (a worker keeps a few hundred at most)
MAX_TEXT = 256  # worker, host, rack, join and topic names, categories
_LATEST_TIME = 1e11  # seconds since the epoch: year 5138, far past any clock, before an overflow


class UnreadableView(ValueError):
    """A peer's view that the page cannot use; the message says why, in a few words."""


def parse_view(body: bytes, known_partitions: Mapping[str, int]) -> dict[str, Any]:
    """The checked view in `body` (a peer's `/tandem/` response). `known_partitions` maps a
    topic to the partitions the group's assignment gives it."""
    if len(body) > MAX_VIEW_BYTES:
        raise UnreadableView(f"over {MAX_VIEW_BYTES:,} bytes")
    try:
        view = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise UnreadableView("JSON nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UnreadableView(f"not JSON ({exc.__class__.__name__})") from None
    check_view(view, known_partitions)
    return view


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def check_view(view: Any, known_partitions: Mapping[str, int]) -> None:
    """Raise UnreadableView unless every field the group page reads has its type and size."""
    _mapping(view, "the view")
    for key in ("worker", "host", "rack", "app_id", "url"):
        _text(view.get(key), key)
    _optional_int(view.get("epoch"), "epoch")
    _optional_time(view.get("started_at"), "started_at")
    if not isinstance(view.get("leader", False), bool):
        raise UnreadableView("leader is not true or false")
    joins = _mapping(view.get("joins"), "joins", MAX_JOINS)
    for name, join in joins.items():
        _text(name, "a join name")
        _check_join(join, f"join {name[:40]!r}", known_partitions)
    _check_history(view.get("history", {}))
    _check_protocol(view.get("rebalance_protocol"))


def _check_protocol(protocol: Any) -> None:
    """The rebalance protocol the page shows (absent or null on a worker without it)."""
    if protocol is None:
        return
    _mapping(protocol, "rebalance_protocol")
    for key in ("setting", "announced", "group_runs"):
        _text(protocol.get(key), f"rebalance_protocol {key}")
    for key in ("revoked", "pending", "kept"):
        for entry in _list(protocol.get(key, []), f"rebalance_protocol {key}", MAX_LIST * 100):
            _text(entry, f"rebalance_protocol {key}")


def _check_join(join: Any, where: str, known_partitions: Mapping[str, int]) -> None:
    _mapping(join, where)
    inputs = _list(join.get("inputs"), f"{where} inputs", 8)
    for topic in inputs:
        _text(topic, f"{where} inputs")
    for key in ("kind", "how"):
        if key in join:
            _text(join[key], f"{where} {key}")
    limit = next((known_partitions[t] for t in inputs if t in known_partitions), MAX_PARTITIONS)
    count = join.get("partitions")
    if count is not None and not (_is_int(count) and 0 <= count <= limit):
        raise UnreadableView(f"{where} claims {_short(count)} partitions; the group has {limit:,}")
    bound = count if count is not None else limit
    for key in ("actives", "standbys"):
        for partition in _list(join.get(key), f"{where} {key}", bound):
            if not (_is_int(partition) and 0 <= partition < bound):
                raise UnreadableView(f"{where} {key}: {_short(partition)} is not one of its partitions")
    for key in ("lag", "standby_lag", "warmups", "read", "null_values", "dead_letters_by_category"):
        may_be_unknown = key in ("lag", "standby_lag", "warmups")  # a lag not measured yet is null
        for entry, value in _mapping(join.get(key, {}), f"{where} {key}", bound + 8).items():
            _text(entry, f"{where} {key}")
            (_optional_int if may_be_unknown else _int)(value, f"{where} {key}")
    for entry, progress in _mapping(join.get("restoring", {}), f"{where} restoring", bound).items():
        _text(entry, f"{where} restoring")
        _mapping(progress, f"{where} restoring")
        _optional_int(progress.get("to_go"), f"{where} restoring to_go")
    for key in ("results", "unmatched", "late", "duplicates", "held"):
        _int(join.get(key), f"{where} {key}")
    _int(join.get("rereads", 0), f"{where} rereads")
    for rebalance in _list(join.get("rebalance_history", []), f"{where} rebalance_history", MAX_LIST):
        _check_rebalance(rebalance, f"{where} rebalance_history", bound)


def _check_rebalance(rebalance: Any, where: str, partitions: int) -> None:
    _mapping(rebalance, where)
    _int(rebalance.get("epoch"), f"{where} epoch")
    _int(rebalance.get("replayed"), f"{where} replayed")
    seconds = rebalance.get("seconds")
    if seconds is not None and not _is_number(seconds):
        raise UnreadableView(f"{where} seconds is not a number")
    for key in ("kept", "moved_warm", "moved_cold"):
        for partition in _list(rebalance.get(key), f"{where} {key}", partitions):
            _int(partition, f"{where} {key}")


def _check_history(history: Any) -> None:
    _mapping(history, "history")
    for sample in _list(history.get("samples", []), "history samples", MAX_LIST):
        _mapping(sample, "history samples")
        _time(sample.get("at"), "history samples at")
        for key in ("read", "lag"):
            _int(sample.get(key), f"history samples {key}")
    for entry in _list(history.get("group_rebalances", []), "history group_rebalances", MAX_LIST):
        _mapping(entry, "history group_rebalances")
        _int(entry.get("epoch"), "history group_rebalances epoch")
        _time(entry.get("at"), "history group_rebalances at")
        _text(entry.get("protocol"), "history group_rebalances protocol")
        for key in ("tasks", "kept", "moved_warm", "moved_cold"):
            _int(entry.get(key), f"history group_rebalances {key}")
        if not _is_number(entry.get("plan_ms")):
            raise UnreadableView("history group_rebalances plan_ms is not a number")


# -- the checks ---------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _int(value: Any, where: str) -> None:
    if not _is_int(value):
        raise UnreadableView(f"{where} is not an integer")


def _optional_int(value: Any, where: str) -> None:
    if value is not None:
        _int(value, where)


def _time(value: Any, where: str) -> None:
    if not (_is_number(value) and 0 <= value <= _LATEST_TIME):
        raise UnreadableView(f"{where} is not a time")


def _optional_time(value: Any, where: str) -> None:
    if value is not None:
        _time(value, where)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UnreadableView(f"{where} is not text")
    if len(value) > MAX_TEXT:
        raise UnreadableView(f"{where} is over {MAX_TEXT} characters")
    return value


def _mapping(value: Any, where: str, most: int | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnreadableView(f"{where} is not an object")
    if most is not None and len(value) > most:
        raise UnreadableView(f"{where} has {len(value):,} entries (at most {most:,})")
    return value


def _list(value: Any, where: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise UnreadableView(f"{where} is not a list")
    if len(value) > most:
        raise UnreadableView(f"{where} has {len(value):,} entries (at most {most:,})")
    return value


def _short(value: Any) -> str:
    """A peer's value in a reason: short, whatever it is."""
    text = f"{value:,}" if _is_int(value) else repr(value)
    return text if len(text) <= 24 else text[:21] + "..."
