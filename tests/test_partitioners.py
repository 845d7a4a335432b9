"""tables.records.partitioners against the clients' own reference vectors and a second implementation.

Oracles: Kafka's `UtilsTest.testMurmur2` (Java), librdkafka's `unittest_murmur2`
(src/rdmurmur2.c) and its partitioner test 0048 (CRC32 values and the partition of each
key), aiokafka's pure-Python `murmur2` and `DefaultPartitioner`, and zlib's CRC-32.
The real clients on a real broker: tests/test_partitioners_clients.py.
"""

from __future__ import annotations

import zlib

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.records.partitioners import (
    PARTITIONERS,
    Misplaced,
    Partitioner,
    crc32,
    find_misplaced,
    misplaced_reason,
    murmur2,
    murmur2_many,
    parse_partitioner,
    partition_for,
    partitions_for,
)

# Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2:
# Utils.murmur2 returns a signed Java int.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
# librdkafka's src/rdmurmur2.c, unittest_murmur2 (checked there against the Java client),
# including the unaligned suffixes of "1234" and of a longer string.
_UNALIGNED = b"PreAmbleWillBeRemoved,ThePrePartThatIs"
LIBRDKAFKA_MURMUR2 = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    _UNALIGNED: 0x78424F1C,
    _UNALIGNED[1:]: 0x4A62B377,
    _UNALIGNED[2:]: 0xE0E4E09E,
    _UNALIGNED[3:]: 0x62B8B43F,
    b"": 0x106E08D9,
}
# librdkafka's tests/0048-partitioner.c: the keys' CRC32 ("consistent") and murmur2 values,
# from which it expects `value % partition_cnt` (7 or 17 partitions).
LIBRDKAFKA_0048 = {  # key: (crc32, murmur2)
    b"23456": (0xB1B451D7, 0x058D780F),
    b"this is another string with more length to it perhaps": (0xB0150DF7, 0x4F7703DA),
    b"hejsan": (0xD077037E, 0x5EC19395),
}

keys = st.binary(max_size=64)
key_lists = st.lists(keys, max_size=40)
same_length_lists = st.integers(0, 64).flatmap(lambda n: st.lists(st.binary(min_size=n, max_size=n)))
partition_counts = st.integers(min_value=1, max_value=200)
real_partitioners = st.sampled_from(["murmur2", "crc32"])


def signed(h: int) -> int:
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(("key", "expected"), JAVA_MURMUR2.items(), ids=repr)
def test_murmur2_equals_the_java_clients_test_vectors(key: bytes, expected: int) -> None:
    assert signed(murmur2(key)) == expected
    assert [signed(h) for h in murmur2_many([key] * 20).tolist()] == [expected] * 20


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_MURMUR2.items(), ids=repr)
def test_murmur2_equals_librdkafkas_test_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected
    assert murmur2_many([key] * 9).tolist() == [expected] * 9


def test_both_clients_vectors_in_one_batch_of_mixed_lengths() -> None:
    vectors = {**{k: v & 0xFFFFFFFF for k, v in JAVA_MURMUR2.items()}, **LIBRDKAFKA_MURMUR2}
    assert murmur2_many(list(vectors)).tolist() == list(vectors.values())


@pytest.mark.parametrize("partitions", [7, 17])
def test_partitions_librdkafka_expects_in_its_partitioner_test(partitions: int) -> None:
    for key, (crc, mm) in LIBRDKAFKA_0048.items():
        assert crc32(key) == crc
        assert partition_for(key, partitions, "crc32") == crc % partitions  # consistent
        assert partition_for(key, partitions, "murmur2") == (mm & 0x7FFFFFFF) % partitions
    # `consistent` maps the empty key to crc32(b"") = 0: partition 0 (0048 expects 0x0 % n).
    assert partition_for(b"", partitions, "crc32") == 0


def test_kafka_partition_clears_the_sign_bit_rather_than_taking_abs() -> None:
    # Java's Utils.toPositive is `h & 0x7fffffff`; abs() would give another partition.
    assert partition_for(b"foobar", 10, "murmur2") == (-790332482 & 0x7FFFFFFF) % 10 == 6
    assert abs(-790332482) % 10 == 2


@settings(max_examples=300, deadline=None)
@given(keys, partition_counts)
def test_murmur2_partition_equals_aiokafkas_default_partitioner(key: bytes, partitions: int) -> None:
    everyone = list(range(partitions))
    assert murmur2(key) == aiokafka_murmur2(key)
    assert partition_for(key, partitions, "murmur2") == DefaultPartitioner()(key, everyone, everyone)


@settings(max_examples=200, deadline=None)
@given(keys, partition_counts)
def test_crc32_partition_is_zlibs_crc32(key: bytes, partitions: int) -> None:
    assert partition_for(key, partitions, "crc32") == zlib.crc32(key) % partitions


@settings(max_examples=300, deadline=None)
@given(st.one_of(key_lists, same_length_lists))
def test_vectorised_murmur2_equals_the_per_key_function(batch: list[bytes]) -> None:
    """Mixed lengths, one length (the fast path), below and above the per-key cut-off."""
    assert murmur2_many(batch).tolist() == [murmur2(k) for k in batch]


@settings(max_examples=200, deadline=None)
@given(key_lists, partition_counts, real_partitioners)
def test_partitions_for_equals_partition_for(
    batch: list[bytes], partitions: int, partitioner: Partitioner
) -> None:
    assert partitions_for(batch, partitions, partitioner).tolist() == [
        partition_for(k, partitions, partitioner) for k in batch
    ]


def expected_misplaced(
    batch: list[bytes | None], partition: int, partitions: int, partitioner: Partitioner
) -> list[Misplaced]:
    """The check, record by record: judged keys whose partition is another."""
    found = []
    for i, key in enumerate(batch):
        if key is None or (partitioner == "crc32" and key == b""):
            continue  # placed anywhere by every client / by consistent_random
        belongs = partition_for(key, partitions, partitioner)
        if belongs != partition:
            found.append(Misplaced(i, belongs))
    return found


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.just(b""), keys), max_size=40),
    st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
    real_partitioners,
)
def test_batch_check_equals_the_per_key_function(
    batch: list[bytes | None], count_and_partition: tuple[int, int], partitioner: Partitioner
) -> None:
    partitions, partition = count_and_partition
    found = find_misplaced(batch, partition, partitions, partitioner)
    assert found == expected_misplaced(batch, partition, partitions, partitioner)
    assert all(type(m.index) is int and type(m.expected) is int for m in found)  # JSON-safe


def test_a_well_partitioned_batch_has_nothing_misplaced() -> None:
    batch = [f"auction-{i}".encode() for i in range(5000)]
    for partitioner in ("murmur2", "crc32"):
        placed = partitions_for(batch, 6, partitioner)  # type: ignore[arg-type]
        for p in range(6):
            mine = [k for k, q in zip(batch, placed.tolist(), strict=True) if q == p]
            assert mine and find_misplaced(mine, p, 6, partitioner) == []  # type: ignore[arg-type]


def test_murmur2_and_crc32_disagree_on_most_keys() -> None:
    """Why mixed producers lose joins: on 4 partitions ~3 keys in 4 land elsewhere."""
    batch = [f"auction-{i}".encode() for i in range(10_000)]
    differ = partitions_for(batch, 4, "murmur2") != partitions_for(batch, 4, "crc32")
    assert 0.72 < differ.mean() < 0.78


def test_none_checks_nothing_and_implies_no_partition() -> None:
    assert find_misplaced([b"a", b"b", None], 0, 3, "none") == []
    with pytest.raises(ValueError, match="implies no partition"):
        partition_for(b"a", 3, "none")
    with pytest.raises(ValueError, match="implies no partition"):
        partitions_for([b"a"], 3, "none")


def test_bad_partition_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for(b"a", 0, "murmur2")
    with pytest.raises(ValueError, match="not one of the topic's 4"):
        find_misplaced([b"a"], 4, 4, "murmur2")
    assert find_misplaced([], 9, 4, "murmur2") == []  # an empty fetch is never an error


def test_keys_that_are_not_bytes_are_refused_not_judged() -> None:
    with pytest.raises(TypeError):
        find_misplaced(["auction-1", "auction-2"], 0, 4, "crc32")  # type: ignore[list-item]


@pytest.mark.parametrize("name", PARTITIONERS)
def test_parse_accepts_the_three_settings(name: str) -> None:
    assert parse_partitioner(name) == name


@pytest.mark.parametrize("value", ["MURMUR2", "murmur", "", "crc", None, 2])
def test_parse_rejects_anything_else_naming_the_allowed_values(value: object) -> None:
    with pytest.raises(ValueError, match="expected one of murmur2, crc32, none"):
        parse_partitioner(value)


def test_parse_maps_librdkafkas_names_in_its_error() -> None:
    with pytest.raises(ValueError, match="librdkafka's 'consistent_random' is 'crc32' here"):
        parse_partitioner("consistent_random")
    with pytest.raises(ValueError, match="librdkafka's 'murmur2_random' is 'murmur2' here"):
        parse_partitioner("murmur2_random")


def test_reason_names_both_partitions_and_the_likely_cause() -> None:
    reason = misplaced_reason(1, 3, "murmur2")
    assert "partition 3 under murmur2" in reason and "read from partition 1" in reason
    assert "partitioner=murmur2_random" in reason
    assert "murmur2" in misplaced_reason(0, 2, "crc32") and "partition 2 under crc32" in misplaced_reason(
        0, 2, "crc32"
    )
