"""Tandem's versioned, compact wire format for consumer-group user data.

Every message starts with a 4-byte header: ``b"TD"``, a version byte and a
flags byte (bit 0: the body is zlib-compressed). The body is a compact binary
encoding: unsigned LEB128 varints, strings as length + UTF-8, a table of topic
names referenced by index, and partition sets as sorted deltas. Topics holding
the same partitions (a co-partition group) share one entry, so a member's three
co-partitioned topics cost one partition list, not three.

Three messages:

* :class:`Subscription` (member -> leader): the member's own state only
  (previous actives and standbys, epoch, url, host, rack, capacity, and the
  changelog offsets of state on its disk), never a map of the cluster.
* :class:`Assignment` (leader -> member): the member's own actives and
  standbys, the group's co-partition groups, the leader's url and the
  rebalance's statistics; version 2 adds its warm-up replicas and the group's
  pending moves (written only when there are some, and only to a member whose
  protocol metadata says it reads version 2: see :data:`VERSION_WARMUPS`).
* :class:`RoutingTable` (leader -> anyone who asks): which member url owns
  each partition, for key routing; too big to send to every member, so it is
  served separately (see docs/assignor-adapter.md).

Decoders raise :class:`WireError` for anything they cannot read;
:func:`read_subscription` turns that into "no history" with a warning, so
the leader never crashes on a member's bytes. Given the group's :class:`Limits`
(the real topics and their partition counts), it also bounds the work a
subscription can cost the leader to O(partitions in the group), whatever the
bytes, and drops whatever the subscription claims outside those topics
(docs/reliability.md, "Hostile input: the group and the leader").
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import re
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

log = logging.getLogger(__name__)

MAGIC = b"TD"
VERSION = 1  # what subscriptions, routing tables and assignments without warm-ups are written as
# Assignments with warm-ups (KIP-441): version 1 plus trailing fields. A member announces that it
# reads them with this number as its protocol metadata version (outside the user data, which an
# older leader reads unchanged); other members get their warm-ups as plain standbys.
VERSION_WARMUPS = 2
# Cooperative rounds (KIP-429): version 2 plus what this member revokes now, what it gets in the
# follow-up, whether the group rebalances again, and that the round is cooperative. A member
# announces it reads them (and keeps running what stays its own through a rebalance) with this
# number as its protocol metadata version; the leader plans cooperatively only when every
# member does (assignor/faust_adapter/partition_assignor.py).
VERSION_COOPERATIVE = 3
FLAG_ZLIB = 0x01
KIND_SUBSCRIPTION, KIND_ASSIGNMENT, KIND_ROUTING = 1, 2, 3
HEADER = struct.Struct(">2sBB")
MAX_BODY = 64 * 1024 * 1024  # refuse zip bombs: no real body comes near this
# Every varint holds an unsigned 64-bit value (10 bytes at most): the writer refuses more, so
# whatever a leader encodes, every member decodes.
MAX_VARINT = 2**64 - 1
# The highest epoch a leader accepts from a member: the next one (max + 1) still fits a varint,
# and leaves room for 2**62 more rebalances, which no group will ever see.
MAX_EPOCH = 2**62
# A member's url, host or rack longer than this is ignored (no real one comes near it).
MAX_LABEL = 1024
MAX_PROBLEMS_SHOWN = 5  # a forged subscription's warning names its first problems only
# zlib only pays on bodies this large: a member's own assignment is usually smaller, and a
# level-9 deflate setup per member cost the leader more than its whole encoding.
MIN_COMPRESSED = 256

TopicPartitions = dict[str, list[int]]
_HIGH_BYTE = re.compile(rb"[\x80-\xff]")  # a varint byte with more to follow


class WireError(ValueError):
    """Bytes that are not a readable Tandem message of the expected kind."""


@dataclass(frozen=True)
class Subscription:
    epoch: int = 0
    url: str = ""
    host: str = ""
    rack: str = ""
    capacity: float = 1.0
    previous_active: TopicPartitions = field(default_factory=dict)
    previous_standby: TopicPartitions = field(default_factory=dict)
    local_offsets: dict[str, dict[int, int]] = field(default_factory=dict)


NO_HISTORY = Subscription()


@dataclass(frozen=True)
class RebalanceStats:
    """Stateful tasks kept by their owner, moved to a warm or a cold member."""

    tasks: int = 0
    kept: int = 0
    moved_warm: int = 0
    moved_cold: int = 0
    plan_ms: int = 0
    pending: int = 0  # moves held on a caught-up member until their target has caught up
    warmups: int = 0  # warm-up replicas in the whole group


@dataclass(frozen=True)
class Assignment:
    epoch: int = 0
    active: TopicPartitions = field(default_factory=dict)
    standby: TopicPartitions = field(default_factory=dict)
    topic_groups: list[list[str]] = field(default_factory=list)
    leader_url: str = ""
    stats: RebalanceStats = field(default_factory=RebalanceStats)
    warmup: TopicPartitions = field(default_factory=dict)  # changelog partitions to warm up
    # Cooperative rounds: partitions this member gives up now (it ran them: it releases them,
    # then asks for the follow-up), those it gets in the follow-up (pending), and whether the
    # group rebalances again once the revocations are done.
    revoking: TopicPartitions = field(default_factory=dict)
    incoming: TopicPartitions = field(default_factory=dict)
    follow_up: bool = False
    cooperative: bool = False  # planned as a cooperative round: keep what stays through the next

    @property
    def has_warmups(self) -> bool:
        """Whether this assignment needs version 2 (warm-ups, or moves pending in the group)."""
        return bool(self.warmup) or self.stats.pending > 0 or self.stats.warmups > 0

    @property
    def has_cooperative(self) -> bool:
        """Whether this assignment needs version 3 (a cooperative round that moves something)."""
        return self.cooperative or bool(self.revoking) or bool(self.incoming) or self.follow_up


@dataclass(frozen=True)
class RoutingTable:
    """Owner of every partition of every group: ``owners[g][p]`` indexes ``urls``."""

    epoch: int = 0
    urls: list[str] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)
    owners: list[list[int]] = field(default_factory=list)  # -1: no owner

    def owner(self, topic: str, partition: int) -> str | None:
        for topics, owners in zip(self.groups, self.owners, strict=True):
            if topic in topics and 0 <= partition < len(owners) and owners[partition] >= 0:
                return self.urls[owners[partition]]
        return None

    def by_url(self, topics: set[str]) -> dict[str, dict[str, list[int]]]:
        """url -> topic -> owned partitions, for the given topics (Faust's metadata shape)."""
        result: dict[str, dict[str, list[int]]] = {url: {} for url in self.urls}
        for group, owners in zip(self.groups, self.owners, strict=True):
            for topic in sorted(set(group) & topics):
                for partition, owner in enumerate(owners):
                    if owner >= 0:
                        result[self.urls[owner]].setdefault(topic, []).append(partition)
        return result


# ---------------------------------------------------------------- writer


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.names: dict[str, int] = {}

    def uint(self, value: int) -> None:
        if value < 0:
            raise WireError(f"negative value {value} where an unsigned one belongs")
        if value > MAX_VARINT:
            raise WireError(f"value {value:#x} does not fit the 64 bits of a varint")
        while value >= 0x80:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)

    def sint(self, value: int) -> None:
        self.uint(value * 2 if value >= 0 else -value * 2 - 1)  # zigzag

    def text(self, value: str) -> None:
        raw = value.encode("utf-8")
        self.uint(len(raw))
        self.buf += raw

    def double(self, value: float) -> None:
        self.buf += struct.pack(">d", value)

    def topic(self, name: str) -> None:
        self.uint(self.names.setdefault(name, len(self.names)))

    def partitions(self, partitions: Iterable[int]) -> None:
        self.sorted_partitions(sorted(set(partitions)))

    def sorted_partitions(self, ordered: list[int] | tuple[int, ...]) -> None:
        """Partitions already sorted and distinct, as a count and deltas."""
        self.uint(len(ordered))
        if not ordered:
            return
        if ordered[0] < 0:
            raise WireError(f"negative value {ordered[0]} where an unsigned one belongs")
        deltas = [b - a - 1 for a, b in zip([-1, *ordered[:-1]], ordered, strict=True)]
        if max(deltas) < 0x80:  # the usual case: one byte each, written at once
            self.buf += bytes(deltas)
            return
        for delta in deltas:
            self.uint(delta)

    def topic_partitions(self, mapping: Mapping[str, Iterable[int]]) -> None:
        """Topics with equal partition sets share one entry."""
        shared: dict[tuple[int, ...], list[str]] = {}
        for topic in sorted(mapping):
            parts = tuple(sorted(set(mapping[topic])))
            if parts:
                shared.setdefault(parts, []).append(topic)
        self.uint(len(shared))
        for parts, topics in shared.items():
            self.uint(len(topics))
            for topic in topics:
                self.topic(topic)
            self.sorted_partitions(parts)

    def finish(self, kind: int, version: int = VERSION) -> bytes:
        table = _Writer()
        table.uint(kind)
        table.uint(len(self.names))
        for name in self.names:  # dicts keep insertion order = index order
            table.text(name)
        body = bytes(table.buf + self.buf)
        if len(body) >= MIN_COMPRESSED:
            packed = zlib.compress(body, 9)
            if len(packed) < len(body):
                return HEADER.pack(MAGIC, version, FLAG_ZLIB) + packed
        return HEADER.pack(MAGIC, version, 0) + body


# ---------------------------------------------------------------- reader


@dataclass(frozen=True)
class Limits:
    """What the leader knows of the group before it reads a member's subscription: the
    partition count of every topic it plans. A subscription can then cost the leader only
    O(partitions in the group) of work and memory, whatever its bytes (docs/reliability.md)."""

    counts: Mapping[str, int]

    @property
    def partitions(self) -> int:
        return sum(max(0, n) for n in self.counts.values())

    @property
    def max_body(self) -> int:
        """Bytes a real subscription's body can need, with room to spare: its labels, the topic
        names, and for each partition of the group at most an active, a standby and a local
        offset (three deltas and an offset: 24 bytes at most)."""
        names = sum(len(t.encode("utf-8", "replace")) + 4 for t in self.counts)
        return 16 * 1024 + 3 * MAX_LABEL + 2 * names + 32 * self.partitions

    @property
    def max_items(self) -> int:
        """Partitions a real subscription lists in all: each of the group's at most three times
        (active, standby, changelog offset)."""
        return 1024 + 3 * self.partitions


class _Reader:
    def __init__(
        self,
        data: bytes,
        kind: int,
        versions: tuple[int, ...] = (VERSION,),
        max_body: int = MAX_BODY,
        max_items: int | None = None,
    ) -> None:
        self.version, self.data = _body(data, versions, max_body)
        self.pos = 0
        # Partitions the decoded message may hold in all (a topic repeated in one entry would
        # copy its list again each time): linear in the body unless the caller bounds it.
        self.items_left = 64 * len(self.data) + 4096 if max_items is None else max_items
        if self.uint() != kind:
            raise WireError(f"not a message of kind {kind}")
        self.names = [self.text() for _ in range(self.count())]

    def uint(self) -> int:
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80:  # one byte: most counts and deltas
            self.pos = pos + 1
            return data[pos]
        return self.uints(1)[0]

    def uints(self, n: int) -> list[int]:
        """`n` varints in a row: runs of one-byte ones at C speed, the others byte by byte."""
        data, pos = self.data, self.pos
        run = data[pos : pos + n]
        if len(run) == n and (n == 0 or max(run) < 0x80):
            self.pos = pos + n
            return list(run)
        values: list[int] = []
        append = values.append
        left = n
        try:  # running past the end raises IndexError: no bounds check per byte
            while left:
                byte = data[pos]
                if byte < 0x80:  # one-byte varints up to the next high byte, at once
                    high = _HIGH_BYTE.search(data, pos, pos + left)
                    stop = high.start() if high else pos + left
                    if stop > len(data):
                        raise IndexError
                    values += data[pos:stop]
                    left -= stop - pos
                    pos = stop
                    continue
                value, shift = byte & 0x7F, 7
                byte = data[pos + 1]
                pos += 2
                while byte >= 0x80:
                    value |= (byte & 0x7F) << shift
                    shift += 7
                    if shift > 63:
                        raise IndexError
                    byte = data[pos]
                    pos += 1
                if shift == 63 and byte > 1:  # a tenth byte above 1: more than 64 bits
                    raise IndexError
                append(value | byte << shift)
                left -= 1
        except IndexError:
            raise WireError("truncated or overlong varint") from None
        self.pos = pos
        return values

    def sint(self) -> int:
        return self.sints(1)[0]

    def sints(self, n: int) -> list[int]:
        return [(raw >> 1) ^ -(raw & 1) for raw in self.uints(n)]  # zigzag

    def count(self) -> int:
        """A length that the remaining bytes could possibly hold (no huge allocations)."""
        value = self.uint()
        if value > len(self.data) - self.pos:
            raise WireError(f"count {value} exceeds the {len(self.data) - self.pos} bytes left")
        return value

    def raw(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise WireError("truncated")
        chunk = bytes(self.data[self.pos : self.pos + size])
        self.pos += size
        return chunk

    def text(self) -> str:
        try:
            return self.raw(self.count()).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"bad UTF-8: {exc}") from exc

    def double(self) -> float:
        return float(struct.unpack(">d", self.raw(8))[0])

    def topic(self) -> str:
        index = self.uint()
        if index >= len(self.names):
            raise WireError(f"topic index {index} out of range")
        return self.names[index]

    def partitions(self) -> list[int]:
        """Sorted partitions from their deltas: p[k] = sum(delta[:k + 1]) + k."""
        n = self.count()
        return list(map(operator.add, itertools.accumulate(self.uints(n)), range(n)))

    def spend(self, items: int) -> None:
        """Charge decoded partitions to the message's budget."""
        self.items_left -= items
        if self.items_left < 0:
            raise WireError("lists more partitions than the group has (a topic repeated?)")

    def topic_partitions(self) -> TopicPartitions:
        result: TopicPartitions = {}
        for _ in range(self.count()):
            topics = [self.topic() for _ in range(self.count())]
            parts = self.partitions()
            for topic in topics:
                if topic in result:  # the writer names a topic once: this one is forged
                    raise WireError(f"topic {topic!r} listed twice")
                self.spend(len(parts))
                result[topic] = list(parts)
        return result

    def end(self) -> None:
        if self.pos != len(self.data):
            raise WireError(f"{len(self.data) - self.pos} trailing bytes")


def _body(data: bytes, versions: tuple[int, ...], max_body: int = MAX_BODY) -> tuple[int, bytes]:
    if len(data) < HEADER.size:
        raise WireError(f"{len(data)} bytes: shorter than the header")
    magic, version, flags = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"foreign user data (starts with {bytes(data[:4])!r})")
    if version not in versions:
        readable = " or ".join(map(str, versions))
        raise WireError(f"wire version {version}; this worker reads version {readable} here")
    if len(data) - HEADER.size > max_body:
        raise WireError(f"{len(data) - HEADER.size} bytes of body, more than the {max_body} allowed")
    body = bytes(data[HEADER.size :])
    if not flags & FLAG_ZLIB:
        return version, body
    try:
        inflater = zlib.decompressobj()
        out = inflater.decompress(body, max_body)  # never inflates more than that
    except zlib.error as exc:
        raise WireError(f"bad zlib body: {exc}") from exc
    if inflater.unconsumed_tail or not inflater.eof:
        raise WireError(f"zlib body truncated or larger than the {max_body} bytes allowed")
    return version, out


def is_tandem(data: bytes | None) -> bool:
    """Whether ``data`` claims to be a Tandem message (any version)."""
    return bool(data) and bytes(data[:2]) == MAGIC  # type: ignore[index]


# ---------------------------------------------------------------- messages


def encode_subscription(sub: Subscription) -> bytes:
    w = _Writer()
    w.uint(sub.epoch)
    for value in (sub.url, sub.host, sub.rack):
        w.text(value)
    w.double(sub.capacity)
    w.topic_partitions(sub.previous_active)
    w.topic_partitions(sub.previous_standby)
    offsets = {t: o for t, o in sorted(sub.local_offsets.items()) if o}
    w.uint(len(offsets))
    for topic, by_partition in offsets.items():
        w.topic(topic)
        w.partitions(by_partition)
        for partition in sorted(by_partition):
            w.sint(by_partition[partition])
    return w.finish(KIND_SUBSCRIPTION)


def decode_subscription(data: bytes, limits: Limits | None = None) -> Subscription:
    """The subscription in ``data``; with ``limits``, refused (WireError) if its body or the
    partitions it lists are more than any real member of that group can need."""
    if limits is None:
        r = _Reader(data, KIND_SUBSCRIPTION)
    else:
        r = _Reader(data, KIND_SUBSCRIPTION, max_body=limits.max_body, max_items=limits.max_items)
    epoch = r.uint()
    url, host, rack = r.text(), r.text(), r.text()
    capacity = r.double()
    active, standby = r.topic_partitions(), r.topic_partitions()
    offsets: dict[str, dict[int, int]] = {}
    for _ in range(r.count()):
        topic = r.topic()
        if topic in offsets:
            raise WireError(f"offsets of topic {topic!r} listed twice")
        partitions = r.partitions()
        r.spend(len(partitions))
        offsets[topic] = dict(zip(partitions, r.sints(len(partitions)), strict=True))
    r.end()
    return Subscription(epoch, url, host, rack, capacity, active, standby, offsets)


def read_subscription(
    data: bytes | None, member: str, limits: Limits | None = None
) -> tuple[Subscription, str | None]:
    """Decode a member's subscription; unreadable bytes mean "no history", with a warning.

    With ``limits`` (the leader's), the decoding is bounded by the group's size, and what the
    subscription says is checked against the group's real topics (:func:`checked`): anything
    invalid is ignored, with a warning naming the member."""
    if not data:
        return NO_HISTORY, None  # a new member that has nothing to tell
    try:
        sub = decode_subscription(data, limits)
    except WireError as exc:
        warning = f"member {member}: unreadable subscription user data ({exc}); no history"
        log.warning("%s", warning)
        return NO_HISTORY, warning
    if limits is None:
        return sub, None
    sub, problems = checked(sub, limits)
    if not problems:
        return sub, None
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown += f"; and {len(problems) - MAX_PROBLEMS_SHOWN} more"
    warning = f"member {member}: subscription user data ignored in part: {shown}"
    log.warning("%s", warning)
    return sub, warning


def checked(sub: Subscription, limits: Limits) -> tuple[Subscription, list[str]]:
    """The subscription with what cannot be true of this group left out, and what was: an
    epoch above MAX_EPOCH (then 0), a capacity that is not a positive number (then 1), an
    over-long label (then none), and claims or offsets of topics the group does not plan or of
    partitions those topics do not have."""
    problems: list[str] = []
    epoch, capacity = sub.epoch, sub.capacity
    if epoch > MAX_EPOCH:
        problems.append(f"epoch {epoch} above {MAX_EPOCH} (epoch 0 used)")
        epoch = 0
    if not (math.isfinite(capacity) and capacity > 0):
        problems.append(f"capacity {capacity!r} is not a positive number (1 used)")
        capacity = 1.0
    labels = {"url": sub.url, "host": sub.host, "rack": sub.rack}
    for name, value in labels.items():
        if len(value) > MAX_LABEL:
            problems.append(f"{name} of {len(value)} characters, more than {MAX_LABEL}")
            labels[name] = ""
    active = _known(sub.previous_active, limits.counts, "previous active", problems)
    standby = _known(sub.previous_standby, limits.counts, "previous standby", problems)
    offsets: dict[str, dict[int, int]] = {}
    for topic, by_partition in sub.local_offsets.items():
        count = limits.counts.get(topic, 0)
        kept = {p: o for p, o in by_partition.items() if p < count}
        if len(kept) < len(by_partition):
            problems.append(
                f"{len(by_partition) - len(kept)} local offset(s) of {_shown(topic)} not in the group"
            )
        if kept:
            offsets[topic] = kept
    if not problems:
        return sub, problems
    return Subscription(
        epoch, labels["url"], labels["host"], labels["rack"], capacity, active, standby, offsets
    ), problems


def _shown(name: str, limit: int = 60) -> str:
    """A topic name as a warning shows it: repr'd (control characters escaped), cut short."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _known(
    claims: TopicPartitions, counts: Mapping[str, int], name: str, problems: list[str]
) -> TopicPartitions:
    """Claims of the group's topics, on partitions those topics have."""
    kept: TopicPartitions = {}
    for topic, partitions in claims.items():
        count = counts.get(topic, 0)
        valid = [p for p in partitions if p < count]
        if len(valid) < len(partitions):
            dropped = len(partitions) - len(valid)
            problems.append(f"{name} claims {dropped} partition(s) of {_shown(topic)} not in the group")
        elif topic not in counts:  # an entry with no partitions, of a topic the group does not plan
            problems.append(f"{name} names {_shown(topic)}, not in the group")
        if valid:
            kept[topic] = valid
    return kept


def encode_assignment(assignment: Assignment) -> bytes:
    """Version 1 bytes unless the assignment has warm-ups or pending moves (then version 2:
    give those only to members that read it, see :func:`for_reader`)."""
    w = _Writer()
    w.uint(assignment.epoch)
    w.text(assignment.leader_url)
    w.topic_partitions(assignment.active)
    w.topic_partitions(assignment.standby)
    _write_groups(w, assignment.topic_groups)
    s = assignment.stats
    for value in (s.tasks, s.kept, s.moved_warm, s.moved_cold, s.plan_ms):
        w.uint(value)
    if not (assignment.has_warmups or assignment.has_cooperative):
        return w.finish(KIND_ASSIGNMENT)
    w.topic_partitions(assignment.warmup)
    w.uint(s.pending)
    w.uint(s.warmups)
    if not assignment.has_cooperative:
        return w.finish(KIND_ASSIGNMENT, VERSION_WARMUPS)
    w.topic_partitions(assignment.revoking)
    w.topic_partitions(assignment.incoming)
    w.uint(int(assignment.follow_up) | int(assignment.cooperative) << 1)
    return w.finish(KIND_ASSIGNMENT, VERSION_COOPERATIVE)


def decode_assignment(data: bytes) -> Assignment:
    r = _Reader(data, KIND_ASSIGNMENT, (VERSION, VERSION_WARMUPS, VERSION_COOPERATIVE))
    epoch = r.uint()
    leader_url = r.text()
    active, standby = r.topic_partitions(), r.topic_partitions()
    groups = _read_groups(r)
    counts = [r.uint() for _ in range(5)]
    warmup: TopicPartitions = {}
    revoking: TopicPartitions = {}
    incoming: TopicPartitions = {}
    follow_up = cooperative = False
    if r.version >= VERSION_WARMUPS:
        warmup = r.topic_partitions()
        counts += [r.uint(), r.uint()]
    if r.version >= VERSION_COOPERATIVE:
        revoking, incoming = r.topic_partitions(), r.topic_partitions()
        flags = r.uint()
        if flags > 3:
            raise WireError(f"cooperative flags {flags} are not 0 to 3")
        follow_up, cooperative = bool(flags & 1), bool(flags & 2)
    r.end()
    stats = RebalanceStats(*counts)
    return Assignment(
        epoch, active, standby, groups, leader_url, stats, warmup, revoking, incoming, follow_up, cooperative
    )


def for_reader(assignment: Assignment, reader_version: int) -> Assignment:
    """The assignment as a member of that protocol version can read it: a member that does not
    read warm-ups gets them as standbys (it tails them the same way, and reports them back as
    its standbys, which is what the planner expects of a warm-up), and version 1 bytes. Only a
    member of the cooperative protocol reads a cooperative round's fields (version 3)."""
    if reader_version < VERSION_COOPERATIVE and assignment.has_cooperative:
        assignment = replace(assignment, revoking={}, incoming={}, follow_up=False, cooperative=False)
    if reader_version >= VERSION_WARMUPS or not assignment.has_warmups:
        return assignment
    standby = {t: list(p) for t, p in assignment.standby.items()}
    for topic, partitions in assignment.warmup.items():
        standby[topic] = sorted(set(standby.get(topic, [])) | set(partitions))
    stats = replace(assignment.stats, pending=0, warmups=0)
    return replace(assignment, standby=standby, warmup={}, stats=stats)


def encode_routing(table: RoutingTable) -> bytes:
    w = _Writer()
    w.uint(table.epoch)
    w.uint(len(table.urls))
    for url in table.urls:
        w.text(url)
    _write_groups(w, table.groups)
    for owners in table.owners:
        w.uint(len(owners))
        for owner in owners:
            w.uint(owner + 1)  # -1 (no owner) becomes 0
    return w.finish(KIND_ROUTING)


def decode_routing(data: bytes) -> RoutingTable:
    r = _Reader(data, KIND_ROUTING)
    epoch = r.uint()
    urls = [r.text() for _ in range(r.count())]
    groups = _read_groups(r)
    owners = [[r.uint() - 1 for _ in range(r.count())] for _ in groups]
    if any(o >= len(urls) for row in owners for o in row):
        raise WireError("owner index out of range")
    r.end()
    return RoutingTable(epoch, urls, groups, owners)


def _write_groups(w: _Writer, groups: list[list[str]]) -> None:
    w.uint(len(groups))
    for topics in groups:
        w.uint(len(topics))
        for topic in topics:
            w.topic(topic)


def _read_groups(r: _Reader) -> list[list[str]]:
    return [[r.topic() for _ in range(r.count())] for _ in range(r.count())]
