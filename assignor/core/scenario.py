"""Reading a scenario (docs/scenario-format.md) into a sanitised model.

Nothing here raises on bad input: every oddity becomes a warning and a
sensible reading, so the planner on a group leader never crashes.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from assignor.core.warnings import Warnings, canonical, key_order, shown


@dataclass(frozen=True, slots=True)
class Group:
    """A co-partition group: partition p of every topic goes to one member."""

    index: int
    topics: tuple[str, ...]
    counts: tuple[int, ...]  # partition count per topic, aligned with `topics`
    changelogs: tuple[str, ...]

    @property
    def size(self) -> int:
        """Number of tasks; with mismatched counts, the largest (see warnings)."""
        return max(self.counts, default=0)

    @property
    def stateful(self) -> bool:
        return bool(self.changelogs)

    def topics_of(self, partition: int) -> list[str]:
        return [t for t, n in zip(self.topics, self.counts, strict=True) if partition < n]

    def changelogs_of(self, partition: int) -> list[str]:
        counts = dict(zip(self.topics, self.counts, strict=True))
        return [t for t in self.changelogs if partition < counts[t]]

    def label(self) -> str:
        return "+".join(self.topics)


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    topics: frozenset[str]
    host: str
    rack: str | None
    capacity: Fraction
    epoch: int
    previous_active: Mapping[str, Collection[int]]
    previous_standby: Mapping[str, Collection[int]]
    local_offsets: Mapping[str, Mapping[int, int]]
    # previous_active once more as arrays, when it was clean (the usual case), so the
    # planner does not walk a million small lists twice.
    previous_active_flat: FlatPartitions | None = None


# From this many topics a member's lists become arrays while parsing (the values are
# still in cache, and numpy's per-call cost is spread); fewer, only if the claims ask.
EAGER_ARRAYS = 16


@dataclass(frozen=True, slots=True)
class FlatPartitions:
    """A member's clean topic -> partitions: `names[i]` lists `lists[i]`; `flat` chains them."""

    names: list[str]
    lists: list[list[int]]
    flat: list[int]
    lengths: np.ndarray | None = None
    values: np.ndarray | None = None

    @classmethod
    def of(cls, names: list[str], lists: list[list[int]], flat: list[int]) -> FlatPartitions:
        if len(names) < EAGER_ARRAYS:
            return cls(names, lists, flat)
        if len(flat) == len(lists) and all(lists):  # one partition each (many lone topics)
            lengths = np.ones(len(lists), np.int64)
        else:
            lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        return cls(names, lists, flat, lengths, np.array(flat, np.int64))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, values) as arrays."""
        if self.lengths is not None and self.values is not None:
            return self.lengths, self.values
        lengths = np.fromiter(map(len, self.lists), np.int64, len(self.lists))
        return lengths, np.array(self.flat, np.int64)


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """The optional warm-up fields (KIP-441 style); present only when warm-ups are on."""

    acceptable_lag: int  # records behind a changelog partition's end that still count as caught up
    budget: int  # warm-up replicas in the whole group at one time
    end_offsets: Mapping[str, Mapping[int, int]]  # the valid given entries; the rest default


DEFAULT_WARMUP_BUDGET = 2


@dataclass(slots=True)
class Scenario:
    topics: dict[str, int]
    groups: list[Group]
    standby_replicas: int
    members: list[Member]  # sorted by id
    warnings: Warnings = field(default_factory=Warnings)
    warmup: WarmupInput | None = None  # None: warm-ups off (no acceptable_recovery_lag)
    cooperative: bool = False  # "protocol": "cooperative" (KIP-429 rounds); else eager
    # Any "protocol" field: ties between equally good placements are broken canonically, so a
    # follow-up round puts revoked tasks where the first round meant (C4). Without the field
    # the planner breaks ties as it always has (tests/test_planner_warmups_off.py's corpus).
    protocol_named: bool = False

    @property
    def max_epoch(self) -> int:
        return max((m.epoch for m in self.members), default=0)


SCENARIO_FIELDS = frozenset(
    {"topics", "copartition_groups", "changelog_topics", "standby_replicas", "members", "protocol"}
)
PROTOCOLS = ("eager", "cooperative")
# The contract's optional warm-up fields (KIP-441 style); acceptable_recovery_lag turns them on.
WARMUP_FIELDS = frozenset({"acceptable_recovery_lag", "max_warmup_replicas", "changelog_end_offsets"})
MEMBER_FIELDS = frozenset(
    {"topics", "host", "rack", "capacity", "epoch", "previous_active", "previous_standby", "local_offsets"}
)

MAX_OFFSET = 2**63 - 1  # Kafka offsets are signed 64-bit

# Far above any real topic (Kafka advises well under this per cluster); a larger
# count is corrupt metadata, and planning it would allocate gigabytes.
MAX_PARTITIONS = 1_000_000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # the exact type first: no ABC check


def _sorted_keys(raw: Mapping[Any, Any]) -> list[Any]:
    """Keys in one order whatever the JSON's (JSON keys are all strings: a plain sort)."""
    keys = list(raw)
    return sorted(keys) if set(map(type, keys)) <= {str} else sorted(keys, key=key_order)


def parse_scenario(raw: Any) -> Scenario:
    """Sanitise a decoded JSON scenario; never raises."""
    warnings = Warnings()
    if not isinstance(raw, Mapping):
        warnings.add("input", f"scenario is a {type(raw).__name__}, not an object; nothing to plan")
        raw = {}
    topics = _parse_topics(raw.get("topics"), warnings)
    changelogs = _parse_changelogs(raw.get("changelog_topics"), topics, warnings)
    groups = _parse_groups(raw.get("copartition_groups"), topics, changelogs, warnings)
    standby = raw.get("standby_replicas", 0)
    if not _is_int(standby) or standby < 0:
        warnings.add("standby", f"standby_replicas {shown(standby)} is not a non-negative integer; using 0")
        standby = 0
    _warn_unknown_fields(raw, warnings)
    warmup = _parse_warmup(raw, topics, changelogs, warnings)
    cooperative = _parse_protocol(raw, warnings)
    protocol_named = "protocol" in raw
    members = _float_safe_capacities(
        _parse_members(raw.get("members"), topics, changelogs, warnings), warnings
    )
    return Scenario(topics, groups, standby, members, warnings, warmup, cooperative, protocol_named)


def _parse_protocol(raw: Mapping[Any, Any], warnings: Warnings) -> bool:
    """True for `"protocol": "cooperative"`; absent or "eager" is eager, anything else a warning."""
    protocol = raw.get("protocol", "eager")
    if not isinstance(protocol, str) or protocol not in PROTOCOLS:
        warnings.add("protocol", f"protocol {shown(protocol)} is not 'eager' or 'cooperative'; using 'eager'")
        return False
    return protocol == "cooperative"


# Capacities are only ever compared as ratios; the planner's floats hold these ratios.
_CAPACITY_SPREAD = 2**500


def _float_safe_capacities(members: list[Member], warnings: Warnings) -> list[Member]:
    """The capacities as the same ratios, within the range of a float (a capacity may be any
    positive number: 1e400 written as an integer is one). All are divided by one power of two
    (every quota stays exact); a capacity more than 2**500 times smaller than the largest is
    raised to that, with a warning (a ratio no float holds)."""
    if not members:
        return members
    top = max(m.capacity for m in members)
    low = min(m.capacity for m in members)
    if Fraction(1, 2**512) <= top <= 2**512 and low * _CAPACITY_SPREAD >= top:
        return members  # the usual case: nothing to do (and no Fraction arithmetic per member)
    shift = Fraction(2) ** (top.numerator.bit_length() - top.denominator.bit_length())
    floor = Fraction(1, _CAPACITY_SPREAD)
    out = []
    for m in members:
        capacity = m.capacity / shift
        if capacity < floor:
            warnings.member(
                m.id,
                "capacity",
                f"member {m.id!r}: capacity more than 2**500 times smaller than the largest; "
                "counted as the largest / 2**500",
            )
            capacity = floor
        out.append(dataclasses.replace(m, capacity=capacity) if capacity != m.capacity else m)
    return out


def _warn_unknown_fields(raw: Mapping[Any, Any], warnings: Warnings) -> None:
    # Where the planner before warm-ups warned about these fields: with warm-ups off the output
    # differs from that planner's only in this line's words.
    ignored = sorted(WARMUP_FIELDS.intersection(raw))
    if ignored and "acceptable_recovery_lag" not in raw:
        warnings.add(
            "input", f"warm-up fields {ignored} ignored: warm-ups are off without acceptable_recovery_lag"
        )
    unknown = sorted((k for k in raw if k not in SCENARIO_FIELDS | WARMUP_FIELDS), key=key_order)
    if unknown:
        warnings.add("input", f"unknown fields {[shown(k) for k in unknown]} ignored")


def _parse_warmup(
    raw: Mapping[Any, Any], topics: dict[str, int], changelogs: set[str], warnings: Warnings
) -> WarmupInput | None:
    """The warm-up fields: on when `acceptable_recovery_lag` is present (even if bad)."""
    if "acceptable_recovery_lag" not in raw:
        return None  # any other warm-up field is a warning of _warn_unknown_fields
    lag = raw["acceptable_recovery_lag"]
    if not _is_int(lag) or lag < 0:
        warnings.add("warmup", f"acceptable_recovery_lag {shown(lag)} is not a non-negative integer; using 0")
        lag = 0
    budget = raw.get("max_warmup_replicas", DEFAULT_WARMUP_BUDGET)
    if not _is_int(budget) or budget < 0:
        warnings.add(
            "warmup",
            f"max_warmup_replicas {shown(budget)} is not a non-negative integer; "
            f"using {DEFAULT_WARMUP_BUDGET}",
        )
        budget = DEFAULT_WARMUP_BUDGET
    ends = _parse_end_offsets(raw.get("changelog_end_offsets"), topics, changelogs, warnings)
    return WarmupInput(lag, budget, ends)


def _parse_end_offsets(
    raw: Any, topics: dict[str, int], changelogs: set[str], warnings: Warnings
) -> dict[str, dict[int, int]]:
    """topic -> partition -> end offset; a bad entry is a warning and falls back to the highest
    offset a member reports (so it is simply left out here)."""
    if raw is None:
        return {}
    if not _is_mapping(raw):
        warnings.add("warmup", "changelog_end_offsets is not an object; using the highest reported offsets")
        return {}
    result: dict[str, dict[int, int]] = {}
    for topic in _sorted_keys(raw):
        entries = raw[topic]
        if topic not in changelogs or not _is_mapping(entries):
            what = "not a changelog topic" if topic not in changelogs else "not an object"
            warnings.add("warmup", f"changelog_end_offsets[{shown(topic)}] ignored: {what}")
            continue
        offsets: dict[int, int] = {}
        for key in sorted(entries, key=key_order):
            offset = entries[key]
            partition = _partition_key(key)
            if partition is None or not 0 <= partition < topics[topic] or partition in offsets:
                reason = "given twice" if partition in offsets else "not a partition of the topic"
                warnings.add("warmup", f"changelog_end_offsets[{topic!r}][{shown(key)}] ignored: {reason}")
            elif not _is_int(offset) or not 0 <= offset <= MAX_OFFSET:
                warnings.add(
                    "warmup",
                    f"changelog_end_offsets[{topic!r}][{shown(key)}] = {shown(offset)} is not an offset; "
                    "using the highest reported offset",
                )
            else:
                offsets[partition] = offset
        if offsets:
            result[topic] = offsets
    return result


def _parse_topics(raw: Any, warnings: Warnings) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        warnings.add("topics", "'topics' is missing or not an object; no topics to assign")
        return {}
    topics: dict[str, int] = {}
    for name in sorted(raw, key=key_order):
        count = raw[name]
        if not isinstance(name, str) or not name:
            warnings.add("topics", f"topic name {shown(name)} is not a non-empty string; ignored")
        elif not _is_int(count) or not 0 <= count <= MAX_PARTITIONS:
            warnings.add("topics", f"topic {name!r} has partition count {shown(count)}; ignored")
        else:
            topics[name] = count
    return topics


def _string_list(raw: Any) -> list[str] | None:
    if not isinstance(raw, list | tuple) or not set(map(type, raw)) <= {str}:
        return None
    return list(raw)


def _parse_changelogs(raw: Any, topics: dict[str, int], warnings: Warnings) -> set[str]:
    if raw is None:
        return set()
    names = _string_list(raw)
    if names is None:
        warnings.add("changelogs", "'changelog_topics' is not a list of strings; ignored")
        return set()
    unknown = sorted(set(names) - set(topics))
    if unknown:
        warnings.add("changelogs", f"changelog topics not in 'topics' ignored: {unknown}")
    return set(names) & set(topics)


def _parse_groups(raw: Any, topics: dict[str, int], changelogs: set[str], warnings: Warnings) -> list[Group]:
    declared: list[list[str]] = []
    if raw is not None and not isinstance(raw, list | tuple):
        warnings.add("groups", "'copartition_groups' is not a list; every topic stands alone")
        raw = []
    for entry in sorted(raw or [], key=canonical):  # the list's order means nothing
        names = _string_list(entry)
        if names is None:
            warnings.add("groups", f"co-partition group {shown(entry)} is not a list of topic names")
            continue
        unknown = sorted(set(names) - set(topics))
        if unknown:
            warnings.add("groups", f"co-partition group {sorted(names)}: unknown topics {unknown}")
        known = sorted(set(names) & set(topics))
        if not known:
            warnings.add("groups", f"co-partition group {sorted(names)} has no known topic; ignored")
            continue
        declared.append(known)
    merged = _merge_overlapping(declared, warnings)
    grouped = {t for g in merged for t in g}
    merged += [[t] for t in topics if t not in grouped]
    merged.sort()
    result = []
    for index, names in enumerate(merged):
        counts = tuple(topics[t] for t in names)
        if len(set(counts)) > 1:
            detail = ", ".join(f"{t}={n}" for t, n in zip(names, counts, strict=True))
            warnings.add(
                "groups",
                f"co-partition group {names} has mismatched partition counts ({detail}); "
                f"using {max(counts)} tasks, task p covering the topics that have partition p",
            )
        logs = tuple(t for t in names if t in changelogs)
        result.append(Group(index, tuple(names), counts, logs))
    return result


def _merge_overlapping(groups: list[list[str]], warnings: Warnings) -> list[list[str]]:
    """Union groups that share a topic: co-partitioning is transitive."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.setdefault(t, t) != t:
            t = parent[t]
        return t

    for names in groups:
        for other in names[1:]:
            a, b = find(names[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    by_root: dict[str, set[str]] = {}
    for names in groups:
        for t in names:
            by_root.setdefault(find(t), set()).add(t)
    merged = [sorted(ts) for ts in by_root.values()]
    if sum(len(g) for g in groups) != sum(len(g) for g in merged):
        warnings.add("groups", "co-partition groups share topics; merged into " + str(sorted(merged)))
    return merged


@dataclass(frozen=True, slots=True)
class _Catalog:
    """The topics, with what every member's check needs computed once, not per member."""

    counts: dict[str, int]
    names: frozenset[str]
    largest: int  # the largest partition count
    uniform: bool  # every topic has the same partition count

    @classmethod
    def of(cls, counts: dict[str, int]) -> _Catalog:
        largest = max(counts.values(), default=0)
        return cls(counts, frozenset(counts), largest, len(set(counts.values())) <= 1)


def _parse_members(
    raw: Any, topics: dict[str, int], changelogs: set[str], warnings: Warnings
) -> list[Member]:
    if not _is_mapping(raw):
        warnings.add("members", "'members' is missing or not an object; no members")
        return []
    catalog = _Catalog.of(topics)
    members: list[Member] = []
    # One frozenset per distinct subscription: 2,000 members of 500 topics would
    # otherwise hold 2,000 equal sets (64 MB).
    subscriptions: dict[frozenset[str], frozenset[str]] = {}
    for member_id in _sorted_keys(raw):
        if not isinstance(member_id, str):
            warnings.add("members", f"member id {shown(member_id)} is not a string; ignored")
            continue
        member = _parse_member(member_id, raw[member_id], catalog, changelogs, subscriptions, warnings)
        members.append(member)
    return members


def _parse_member(
    member_id: str,
    raw: Any,
    catalog: _Catalog,
    changelogs: set[str],
    subscriptions: dict[frozenset[str], frozenset[str]],
    warnings: Warnings,
) -> Member:
    if not _is_mapping(raw):
        warnings.member(
            member_id,
            "data",
            f"member {member_id!r}: data unreadable; no subscription, no history",
        )
        raw = {}
    unknown_fields = (
        []
        if MEMBER_FIELDS.issuperset(raw)
        else _sorted_keys({k: None for k in raw if k not in MEMBER_FIELDS})
    )
    if unknown_fields:
        fields = [shown(k) for k in unknown_fields]
        warnings.member(member_id, "fields", f"member {member_id!r}: unknown fields {fields} ignored")
    subscription = _string_list(raw.get("topics"))
    if subscription is None:
        warnings.member(member_id, "topics", f"member {member_id!r}: 'topics' missing or not a list of names")
        subscription = []
    unknown = sorted(set(subscription) - catalog.names)
    if unknown:
        warnings.member(member_id, "topics", f"member {member_id!r} subscribes to unknown topics {unknown}")
    previous_active, active_flat = _parse_partitions(
        member_id, "previous_active", raw.get("previous_active"), catalog, warnings
    )
    previous_standby, _ = _parse_partitions(
        member_id, "previous_standby", raw.get("previous_standby"), catalog, warnings, flat=False
    )
    previous_standby = _changelogs_only(
        member_id,
        "previous_standby",
        raw.get("previous_standby"),
        previous_standby,
        changelogs,
        catalog,
        warnings,
    )
    topics = catalog.names.intersection(subscription)
    return Member(
        id=member_id,
        topics=subscriptions.setdefault(topics, topics),
        host=_parse_label(member_id, "host", raw.get("host"), member_id, warnings) or member_id,
        rack=_parse_label(member_id, "rack", raw.get("rack"), None, warnings),
        capacity=_parse_capacity(member_id, raw.get("capacity", 1), warnings),
        epoch=_parse_epoch(member_id, raw.get("epoch", 0), warnings),
        previous_active=previous_active,
        previous_standby=previous_standby,
        local_offsets=_changelogs_only(
            member_id,
            "local_offsets",
            raw.get("local_offsets"),
            _parse_offsets(member_id, raw.get("local_offsets"), catalog.counts, warnings),
            changelogs,
            catalog,
            warnings,
        ),
        previous_active_flat=active_flat,
    )


def _changelogs_only(
    member_id: str,
    name: str,
    raw: Any,
    parsed: Mapping[str, Any],
    changelogs: set[str],
    catalog: _Catalog,
    warnings: Warnings,
) -> Mapping[str, Any]:
    """Only changelog topics hold state: a standby or an offset of another known topic is
    ignored, even an empty one (unknown topics have their own warning)."""
    if not isinstance(raw, Mapping) or changelogs.issuperset(raw):
        return parsed
    others = sorted(t for t in catalog.names.intersection(raw) if t not in changelogs)
    if not others:
        return parsed
    warnings.member(
        member_id,
        name,
        f"member {member_id!r}: {name} names {others}, not changelog topics; ignored",
    )
    return {t: v for t, v in parsed.items() if t in changelogs}


def _parse_label(
    member_id: str, name: str, value: Any, default: str | None, warnings: Warnings
) -> str | None:
    if value is None:
        return default
    if isinstance(value, str) and value:
        return value
    warnings.member(member_id, name, f"member {member_id!r}: {name} {shown(value)} is not a string; ignored")
    return default


def _parse_capacity(member_id: str, value: Any, warnings: Warnings) -> Fraction:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and value > 0 and (isinstance(value, int) or math.isfinite(value)):  # no float() of a big int
        return _capacity(value)
    warnings.member(
        member_id,
        "capacity",
        f"member {member_id!r}: capacity {shown(value)} is not positive; using 1",
    )
    return Fraction(1)


@functools.lru_cache(maxsize=256)
def _capacity(value: float) -> Fraction:
    """Through repr so 0.1 means one tenth, not its binary approximation (cached: most
    members share a capacity, and parsing the text is the slow part)."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _parse_epoch(member_id: str, value: Any, warnings: Warnings) -> int:
    if _is_int(value) and value >= 0:
        return value
    warnings.member(
        member_id, "epoch", f"member {member_id!r}: epoch {shown(value)} is not a non-negative integer; 0"
    )
    return 0


def _parse_partitions(
    member_id: str, name: str, raw: Any, catalog: _Catalog, warnings: Warnings, flat: bool = True
) -> tuple[Mapping[str, Collection[int]], FlatPartitions | None]:
    if raw is None:
        return {}, None
    if not _is_mapping(raw):
        warnings.member(member_id, name, f"member {member_id!r}: {name} is not an object; ignored")
        return {}, None
    fast = _clean_member_partitions(raw, catalog)
    if fast is not None:
        return fast if flat else (fast[0], None)
    return _checked_partitions(member_id, name, raw, catalog.counts, warnings), None


def _checked_partitions(
    member_id: str, name: str, raw: Mapping[Any, Any], topics: dict[str, int], warnings: Warnings
) -> dict[str, Collection[int]]:
    """One list at a time, with a warning for each odd one."""
    result: dict[str, Collection[int]] = {}
    for topic in sorted(raw, key=key_order):  # warnings in one order, whatever the JSON's
        partitions = raw[topic]
        count = topics.get(topic) if isinstance(topic, str) else None
        if count is None:
            warnings.member(
                member_id,
                name,
                f"member {member_id!r}: {name} names unknown topic {shown(topic)}",
            )
        elif _clean_partitions(partitions, count):
            if partitions:
                result[topic] = frozenset(partitions)
        elif not isinstance(partitions, list | tuple):
            warnings.member(member_id, name, f"member {member_id!r}: {name}[{topic!r}] is not a list")
        else:
            valid = frozenset(p for p in partitions if _is_int(p) and 0 <= p < count)
            bad = [p for p in partitions if not (_is_int(p) and 0 <= p < count)]
            warnings.member(
                member_id,
                name,
                f"member {member_id!r}: {name}[{topic!r}] has invalid partitions {shown(bad)}; ignored",
            )
            if valid:
                result[topic] = valid
    return result


_INT_ONLY = {int}
_PLAIN_DECIMAL = re.compile(r"0|[1-9][0-9]{0,17}")  # ASCII digits only; fits an int64
_LIST_ONLY = {list}


def _clean_member_partitions(
    raw: Mapping[str, Any], catalog: _Catalog
) -> tuple[Mapping[str, Collection[int]], FlatPartitions] | None:
    """All of a member's lists checked at once, at C speed; None if anything is odd.

    A member of a large group lists hundreds of topics: a Python-level check per
    list would dominate planning at a million topic-partitions.
    """
    names = list(raw)
    lists = list(raw.values())
    if not names:
        return {}, FlatPartitions([], [], [])
    if not catalog.names.issuperset(names) or not set(map(type, lists)) <= _LIST_ONLY:
        return None
    flat = list(itertools.chain.from_iterable(lists))
    if flat and not set(map(type, flat)) <= _INT_ONLY:
        return None
    if flat and (min(flat) < 0 or max(flat) >= catalog.largest):
        return None  # also keeps numbers beyond int64 away from numpy
    if not catalog.uniform and flat:  # else the max() check above covered every topic
        lengths = np.fromiter(map(len, lists), np.int64, len(lists))
        limits = np.fromiter(map(catalog.counts.__getitem__, names), np.int64, len(names))
        if (np.array(flat, np.int64) >= np.repeat(limits, lengths)).any():
            return None
    # Lists are kept as given (never mutated): converting a million of them costs more
    # than the rest of planning; duplicates inside one are harmless downstream.
    result: Mapping[str, Collection[int]]
    if not all(lists):
        result = {t: ps for t, ps in raw.items() if ps}
    else:  # the caller's own dict (read, never written): a copy per member adds up
        result = raw if type(raw) is dict else dict(raw)
    return result, FlatPartitions.of(names, lists, flat)


def _clean_partitions(partitions: Any, count: int) -> bool:
    """A list of distinct-or-not ints in range: the fast path, checked at C speed."""
    if type(partitions) is not list:
        return False
    if not partitions:
        return True
    return set(map(type, partitions)) <= _INT_ONLY and min(partitions) >= 0 and max(partitions) < count


def _parse_offsets(
    member_id: str, raw: Any, topics: dict[str, int], warnings: Warnings
) -> dict[str, dict[int, int]]:
    if raw is None:
        return {}
    if not _is_mapping(raw):
        warnings.member(
            member_id,
            "local_offsets",
            f"member {member_id!r}: local_offsets is not an object; ignored",
        )
        return {}
    result: dict[str, dict[int, int]] = {}
    for topic in _sorted_keys(raw):
        entries = raw[topic]
        if topic not in topics or not _is_mapping(entries):
            warnings.member(
                member_id,
                "local_offsets",
                f"member {member_id!r}: local_offsets[{shown(topic)}] ignored",
            )
            continue
        offsets = _parse_topic_offsets(member_id, topic, entries, topics[topic], warnings)
        if offsets:
            result[topic] = offsets
    return result


def _parse_topic_offsets(
    member_id: str, topic: str, entries: Mapping[Any, Any], count: int, warnings: Warnings
) -> dict[int, int]:
    """partition -> offset; keys in one order so a duplicate resolves alike whatever the JSON's."""
    clean = _clean_offsets(entries, count)
    if clean is not None:
        return clean
    offsets: dict[int, int] = {}
    for key in sorted(entries, key=key_order):
        offset = entries[key]
        partition = _partition_key(key)
        where = f"member {member_id!r}: local_offsets[{topic!r}][{shown(key)}]"
        if partition is None or not 0 <= partition < count or not _is_int(offset):
            warnings.member(member_id, "local_offsets", f"{where} = {shown(offset)} ignored")
        elif offset > MAX_OFFSET:
            warnings.member(member_id, "local_offsets", f"{where} = {offset} is not a Kafka offset; ignored")
        elif partition in offsets:
            warnings.member(
                member_id, "local_offsets", f"{where}: partition {partition} given twice; this one ignored"
            )
        elif offset < 0:
            warnings.member(member_id, "local_offsets", f"{where} = {offset} is negative; counted as 0")
            offsets[partition] = 0
        else:
            offsets[partition] = offset
    return offsets


def _clean_offsets(entries: Mapping[Any, Any], count: int) -> dict[int, int] | None:
    """The usual case at C speed: plain partition keys in range, non-negative int offsets.

    None if anything is odd (then order matters for the warnings, and the slow path sorts).
    """
    values = list(entries.values())
    if not values:
        return {}
    if not set(map(type, values)) <= _INT_ONLY or min(values) < 0 or max(values) > MAX_OFFSET:
        return None
    keys = list(entries)
    kinds = set(map(type, keys))
    if kinds <= _INT_ONLY:
        partitions = keys
    elif kinds <= {str} and all(map(_PLAIN_DECIMAL.fullmatch, keys)):
        partitions = list(map(int, keys))
    else:
        return None
    offsets = dict(zip(partitions, values, strict=True))
    if len(offsets) < len(keys) or min(partitions) < 0 or max(partitions) >= count:
        return None  # a partition given twice (5 and "5"), or out of range
    return offsets


def _partition_key(key: Any) -> int | None:
    """A partition number: an int, or its plain decimal text ("5", not "05", "+5" or " 5")."""
    if _is_int(key):
        return key
    if isinstance(key, str) and _PLAIN_DECIMAL.fullmatch(key):
        return int(key)
    return None
