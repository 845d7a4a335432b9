"""Fuzzing the leader's inputs: wire decoders (coverage-guided), the planner, the adapter.

tests/test_wire.py and tests/test_planner_properties.py already throw random
bytes and field-level garbage. This goes further:

- the wire decoders get a coverage-guided mutation fuzzer (line arcs of
  assignor/wire.py, traced with sys.settrace): mutants of valid messages that
  reach new code join the corpus, and mutations are also applied *behind* the
  zlib layer (decompress, mutate, recompress) where byte flips never get;
- the planner gets garbage at any depth of the scenario (partition lists,
  offsets, epochs, capacities), not only at the top level;
- the adapter's `assign()` gets members whose user data is fuzzed bytes.

CI runs a fixed seed and a fixed number of iterations (deterministic, ~30 s in
all). For a long run: TANDEM_FUZZ_ITERATIONS=1000000 TANDEM_FUZZ_SECONDS=3600
TANDEM_FUZZ_SEED=random pytest tests/test_fuzz_assignor.py
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import faust
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from assignor import plan, wire
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join
from assignor.wire import (
    Assignment,
    RebalanceStats,
    RoutingTable,
    Subscription,
    WireError,
)

ITERATIONS = int(os.environ.get("TANDEM_FUZZ_ITERATIONS", "0"))
SECONDS = float(os.environ.get("TANDEM_FUZZ_SECONDS", "12"))
_SEED = os.environ.get("TANDEM_FUZZ_SEED", "7")
SEED = random.randrange(2**32) if _SEED == "random" else int(_SEED)

pytestmark = pytest.mark.timeout(max(120, int(SECONDS * 4)))


def budget(default_iterations: int) -> Iterator[int]:
    """Iteration numbers: a fixed count in CI (deterministic), bounded by SECONDS anyway."""
    deadline = time.monotonic() + SECONDS
    for i in range(ITERATIONS or default_iterations):
        if time.monotonic() > deadline:
            return
        yield i


# ---------------------------------------------------------------- the wire format

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "subscription": wire.decode_subscription,
    "assignment": wire.decode_assignment,
    "routing": wire.decode_routing,
}
ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "subscription": wire.encode_subscription,
    "assignment": wire.encode_assignment,
    "routing": wire.encode_routing,
}


def seeds() -> list[tuple[str, bytes]]:
    """Valid messages of every kind, small (plain body) and large (zlib body)."""
    # Big enough for a zlib body, small enough to trace quickly.
    big = {"impressions": list(range(0, 900, 3)), "clicks": list(range(0, 900, 3))}
    subs = [
        Subscription(),
        Subscription(
            epoch=9,
            url="http://w:6066",
            host="h",
            rack="r",
            capacity=2.5,
            previous_active={"a": [1, 2], "b": [1, 2]},
            previous_standby={"c": [3]},
            local_offsets={"c": {3: 77, 1: -1}},
        ),  # fmt: skip
        Subscription(epoch=2**40, previous_active=big, local_offsets={"cl": {p: p for p in range(300)}}),
    ]
    assignments = [
        Assignment(),
        Assignment(
            3, {"a": [0, 5]}, {"c": [1]}, [["a", "b"], ["c"]], "http://l:1", RebalanceStats(4, 1, 2, 1, 7)
        ),  # fmt: skip
        Assignment(7, big, {"cl": list(range(600))}, [["impressions", "clicks", "cl"]], "u"),
    ]
    tables = [
        RoutingTable(4, ["http://a:1", "http://b:1"], [["x", "y"], ["z"]], [[0, 1, -1], [1]]),
        RoutingTable(5, [f"http://w{i}:1" for i in range(50)], [["t"]], [[i % 50 for i in range(600)]]),
    ]
    out = [("subscription", wire.encode_subscription(s)) for s in subs]
    out += [("assignment", wire.encode_assignment(a)) for a in assignments]
    return out + [("routing", wire.encode_routing(t)) for t in tables]


INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFE, 0x3F, 0x40]


def mutate_bytes(data: bytes, rng: random.Random, corpus: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(pos, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(pos, len(out) - 1)] = rng.choice(INTERESTING)
        elif op == 2:
            out[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            del out[pos : pos + rng.randint(1, 16)]
        elif op == 4:
            del out[pos:]
        elif op == 5:  # splice with another message
            other = rng.choice(corpus)[1]
            cut = rng.randrange(len(other) + 1)
            out[pos:] = other[cut:]
        elif op == 6 and out:  # repeat a chunk (counts and lists that go on)
            end = min(len(out), pos + rng.randint(1, 8))
            out[pos:pos] = out[pos:end] * rng.randint(1, 4)
        elif op == 7:  # an overlong or huge varint
            out[pos:pos] = bytes([0xFF] * rng.randint(1, 11)) + b"\x01"
    return bytes(out)


def mutate(data: bytes, rng: random.Random, corpus: list[tuple[str, bytes]]) -> bytes:
    """Mutate the raw bytes, or the body behind the header (recompressing a zlib body)."""
    if len(data) < 4 or rng.random() < 0.4:
        return mutate_bytes(data, rng, corpus)
    header, body = data[:4], data[4:]
    if data[3] & wire.FLAG_ZLIB:
        try:
            plain = zlib.decompress(body)
        except zlib.error:
            return mutate_bytes(data, rng, corpus)
        return header + zlib.compress(mutate_bytes(plain, rng, corpus))
    return header + mutate_bytes(body, rng, corpus)


class ArcTracer:
    """Line arcs executed inside assignor/wire.py: the fuzzer's coverage signal."""

    def __init__(self) -> None:
        self.file = wire.__file__
        self.arcs: set[tuple[int, int]] = set()
        self._last = 0

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.arcs.add((self._last, frame.f_lineno))
            self._last = frame.f_lineno
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == self.file:
            self._last = -frame.f_code.co_firstlineno
            return self._local
        return None

    def run(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, set[tuple[int, int]]]:
        """fn(*args) and the arcs it reached for the first time."""
        before = set(self.arcs)
        sys.settrace(self._global)
        try:
            result = fn(*args)
        finally:
            sys.settrace(None)
        return result, self.arcs - before


def decode_or_wire_error(kind: str, data: bytes) -> Any:
    """Decoding either works or raises WireError; what decodes re-encodes to itself."""
    try:
        decoded = DECODERS[kind](data)
    except WireError:
        return None
    again = ENCODERS[kind](decoded)
    assert ENCODERS[kind](DECODERS[kind](again)) == again
    return decoded


@pytest.fixture(autouse=True)
def _quiet_wire_log() -> Iterator[None]:
    # Thousands of "unreadable user data" warnings would dominate the run time.
    logger = logging.getLogger("assignor.wire")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_wire_decoders_coverage_guided() -> None:
    rng = random.Random(SEED)
    corpus = seeds()
    tracer = ArcTracer()
    for kind, data in corpus:
        tracer.run(decode_or_wire_error, kind, data)
    decoded = refused = 0
    for _ in budget(3000):
        kind, parent = rng.choice(corpus)
        child = mutate(parent, rng, corpus)
        target = rng.choice(list(DECODERS)) if rng.random() < 0.2 else kind
        result, new = tracer.run(decode_or_wire_error, target, child)
        wire.read_subscription(child, "fuzz")  # the leader's entry point: never raises
        decoded, refused = decoded + (result is not None), refused + (result is None)
        if new:
            corpus.append((target, child))
    # The fuzzer must have reached past the header into the body parsers, both ways.
    assert decoded > 10 and refused > 500, (decoded, refused)
    assert len(corpus) > len(seeds()) + 5  # coverage led somewhere new
    print(
        f"wire fuzz (seed {SEED}): {decoded + refused} mutants, {decoded} decoded, {refused} refused, "
        f"{len(tracer.arcs)} arcs, corpus {len(corpus)}"
    )


# ---------------------------------------------------------------- the planner

# Topic counts come from the broker's metadata, not from members, and a huge one makes
# the planner allocate that much memory: they get small garbage only (deep_garble).
GARBAGE: list[Any] = [
    None, True, False, -1, -(2**63), 2**63, 2**70, 10**18, 0, 1.5, float("nan"), float("inf"),
    "", "x", "0", [], {}, [None], [-1], [10**9], [[1]], {"": None}, {"0": [1, 1, 1]},
    ["impressions", 3], {"impressions": [-5, 2**40, 1.0]}, "\ud800",
]  # fmt: skip


def random_scenario(rng: random.Random) -> dict[str, Any]:
    """A valid scenario like the app's: one join with a changelog, a lone topic, history."""
    n = rng.randint(1, 8)
    join = ["impressions", "clicks", "cl"]
    topics = {t: n for t in join} | {"audit": rng.randint(0, 5)}
    members = {}
    for i in range(rng.randint(1, 5)):
        mine = sorted(rng.sample(range(n), rng.randint(0, n)))
        members[f"m{i}"] = {
            "topics": join + (["audit"] if rng.random() < 0.5 else []),
            "host": f"h{rng.randint(0, 2)}", "rack": f"r{rng.randint(0, 1)}",
            "capacity": rng.choice([1, 1, 2]), "epoch": rng.randint(0, 4),
            "previous_active": {"impressions": mine, "clicks": mine, "cl": mine},
            "previous_standby": {"cl": sorted(rng.sample(range(n), rng.randint(0, n)))},
            "local_offsets": {"cl": {str(p): rng.randint(0, 1000) for p in range(n)}},
        }  # fmt: skip
    return {"topics": topics, "copartition_groups": [join], "changelog_topics": ["cl"],
            "standby_replicas": rng.randint(0, 2), "members": members}  # fmt: skip


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into nested dicts and lists."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from paths(child, (*prefix, i))


def deep_garble(scn: dict[str, Any], rng: random.Random) -> Any:
    """Replace, delete, duplicate or grow a value at random depth."""
    for _ in range(rng.randint(1, 5)):
        where = rng.choice(list(paths(scn)))
        if not where:
            continue
        if where[0] == "topics" and len(where) > 1:
            scn["topics"][where[1]] = rng.choice([None, -1, 0, 1.5, "7", [], True, 3])
            continue
        parent = scn
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        op = rng.randrange(4)
        if op == 0:
            parent[last] = copy.deepcopy(rng.choice(GARBAGE))
        elif op == 1:
            del parent[last]
        elif op == 2 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))  # duplicates in a list
        elif op == 3 and isinstance(parent[last], int) and not isinstance(parent[last], bool):
            parent[last] = rng.choice([-1, 2**31, 2**63, parent[last] + 10**6])
    return scn


def check_plan(raw: Any) -> None:
    before = repr(raw)
    assignment = plan(raw)
    assert repr(raw) == before, "the planner mutated its input"
    warmups = isinstance(raw, dict) and "acceptable_recovery_lag" in raw
    keys = {"epoch", "members", "unassigned", "warnings"}
    assert set(assignment) == keys | ({"pending_moves"} if warmups else set())
    internal = [w for w in assignment["warnings"] if "internal planner error" in w]
    assert not internal, (internal, raw)
    owned: set[tuple[str, int]] = set()
    for entry in assignment["members"].values():
        for topic, partitions in entry["active"].items():
            assert partitions == sorted(set(partitions))
            for p in partitions:
                assert (topic, p) not in owned, f"{topic}#{p} has two owners"
                owned.add((topic, p))
    if isinstance(raw, dict) and isinstance(raw.get("topics"), dict):
        for topic, p in owned:
            count = raw["topics"].get(topic)
            assert not isinstance(count, int) or 0 <= p < max(count, 0), (topic, p)
    if warmups:
        _check_pending(assignment)


def _check_pending(assignment: dict[str, Any]) -> None:
    """Each pending move starts at its task's owner (the only member owning any of its topic-partitions:
    with mismatched counts a task covers only some of its group's topics); a warm-up is never on the owner."""
    members = assignment["members"]
    for move in assignment["pending_moves"]:
        owners = {
            m
            for m, entry in members.items()
            for topic in move["topics"]
            if move["partition"] in entry["active"].get(topic, [])
        }
        assert owners == {move["from"]}, (move, owners)
        assert move["to"] in members and move["to"] != move["from"], move
    for entry in members.values():
        for topic, partitions in entry["warmup"].items():
            assert not set(partitions) & set(entry["active"].get(topic, [])), (topic, entry)


def test_planner_total_on_deep_garbage() -> None:
    rng = random.Random(SEED)
    i = 0
    for i in budget(400):
        scn = random_scenario(rng)
        check_plan(deep_garble(scn, rng) if i % 10 else scn)
    print(f"planner fuzz (seed {SEED}): {i + 1} scenarios")


def with_warmups(scn: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The scenario with warm-ups on: a lag, maybe a budget and end offsets."""
    n = scn["topics"]["cl"]
    scn["acceptable_recovery_lag"] = rng.choice([0, 10, 500, 10**6])
    if rng.random() < 0.7:
        scn["max_warmup_replicas"] = rng.choice([0, 1, 2, 5])
    if rng.random() < 0.5:
        scn["changelog_end_offsets"] = {"cl": {str(p): rng.randint(900, 1200) for p in range(n)}}
    return scn


def test_planner_total_on_deep_garbage_with_warm_ups() -> None:
    rng = random.Random(SEED + 1)
    i = 0
    for i in budget(300):
        scn = with_warmups(random_scenario(rng), rng)
        check_plan(deep_garble(scn, rng) if i % 10 else scn)
    print(f"planner fuzz with warm-ups (seed {SEED + 1}): {i + 1} scenarios")


# ---------------------------------------------------------------- the adapter on the leader


class _Cluster:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.counts[topic])) if topic in self.counts else None


def _leader() -> TandemAssignor:
    app = faust.App(f"fuzz-{SEED}", broker="kafka://127.0.0.1:1",
                    PartitionAssignor=TandemAssignor, web_enabled=False)  # fmt: skip
    declare_join(app, ["impressions", "clicks"], "cl")
    return app.assignor  # type: ignore[return-value]


def test_leader_assign_never_raises_on_fuzzed_user_data() -> None:
    rng = random.Random(SEED)
    leader = _leader()
    counts = {"impressions": 6, "clicks": 6, "cl": 6}
    corpus = seeds()
    groups = 0
    for _ in budget(300):
        groups += 1
        members = {}
        for m in range(rng.randint(1, 4)):
            data = mutate(rng.choice(corpus)[1], rng, corpus) if rng.random() < 0.8 else b""
            topics = ["impressions", "clicks", "cl"] + (["ghost"] if rng.random() < 0.1 else [])
            members[f"m{m}"] = ConsumerProtocolMemberMetadata(wire.VERSION, topics, data)
        out = leader.assign(_Cluster(counts), members)
        assert set(out) == set(members)
        owners: dict[tuple[str, int], str] = {}
        for member, assignment in out.items():
            for topic, partitions in assignment.assignment:
                for p in partitions:
                    if topic in ("impressions", "clicks"):
                        assert (topic, p) not in owners, f"{topic}#{p} twice"
                        owners[(topic, p)] = member
        # Every input partition has an owner, the same member for both sides of the join.
        assert {k for k in owners} == {(t, p) for t in ("impressions", "clicks") for p in range(6)}
        assert all(owners[("impressions", p)] == owners[("clicks", p)] for p in range(6))
    print(f"adapter fuzz (seed {SEED}): {groups} groups")


def test_nan_capacity_in_user_data_is_survived() -> None:
    """A hostile member announcing a NaN or infinite capacity cannot break the plan."""
    leader = _leader()
    for capacity in (math.nan, math.inf, -1.0, 0.0):
        data = wire.encode_subscription(Subscription(epoch=1, capacity=capacity))
        good = wire.encode_subscription(Subscription(epoch=1))
        members = {
            "evil": ConsumerProtocolMemberMetadata(wire.VERSION, ["impressions", "clicks", "cl"], data),
            "good": ConsumerProtocolMemberMetadata(wire.VERSION, ["impressions", "clicks", "cl"], good),
        }
        out = leader.assign(_Cluster({"impressions": 4, "clicks": 4, "cl": 4}), members)
        owned = sorted(p for a in out.values() for t, ps in a.assignment if t == "impressions" for p in ps)
        assert owned == [0, 1, 2, 3], capacity


def test_a_partition_claim_beyond_int64_does_not_empty_the_group() -> None:
    """One member's bogus claim (a varint decodes up to 2**70) must not stop the group.

    Found by this fuzzer: every member got nothing; fixed in the planner (60e4f0d)."""
    leader = _leader()
    topics = ["impressions", "clicks", "cl"]

    def md(sub: Subscription) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(wire.VERSION, topics, wire.encode_subscription(sub))

    members = {
        "a": md(Subscription(epoch=3, previous_active={t: [0, 1, 2] for t in topics})),
        "b": md(Subscription(epoch=3, previous_active={t: [3, 4, 5] for t in topics})),
        "evil": md(Subscription(epoch=1, previous_active={"impressions": [2**63]})),
    }
    out = leader.assign(_Cluster({t: 6 for t in topics}), members)
    owned = sorted(p for a in out.values() for t, ps in a.assignment if t == "impressions" for p in ps)
    assert owned == list(range(6))
