"""The audit records compiled (tables/operators/_fastjoin.pyx `audit_many`, `Collector.audit` where it
is built) against the Python loop it mirrors (`Collector.python_audit`, `audit_value`: the
reference), on random results: the same records (key, value bytes, headers) for each partition in
the same order, or the same exception. The fingerprints themselves are checked against the batch
twin's definition in tests/test_tables_api.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.operators.base import Match, fingerprint
from tables.runtime import output
from tables.runtime.output import AUDIT, Collector

fastjoin = pytest.importorskip(
    "tables.operators._fastjoin",
    reason="tables.operators._fastjoin is not built (python setup.py build_ext --inplace)",
)


@pytest.fixture(autouse=True)
def compiled_audit() -> Iterator[None]:
    """The compiled audit whatever TANDEM_PURE_PYTHON says: the one under test here."""
    was = AUDIT.fast, AUDIT.bound
    AUDIT.bound = fastjoin.audit_many
    AUDIT.use(True)
    yield
    AUDIT.fast, AUDIT.bound = was


def collector(writer: str) -> Collector:
    """A Collector with only what its audit reads (no app: the audit sends nothing itself)."""
    made = Collector.__new__(Collector)
    made.audited, made.writer = {}, writer
    return made


def audited(writer: str, feed: list[tuple[Any, Match]], compiled: bool) -> tuple[Any, ...]:
    """What `Collector.audit` keeps for `feed` (compiled or not), or the exception it raised."""
    made = collector(writer)
    AUDIT.use(compiled)
    try:
        made.audit(feed)  # type: ignore[arg-type]
    except Exception as error:
        return ("raised", type(error), str(error), made.audited)
    return ("kept", made.audited)


_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.binary(max_size=40),
    st.builds(bytearray, st.binary(max_size=4)),  # not bytes: the reference decides
    st.sampled_from(["text", 7]),  # the reference raises
)
_times = st.one_of(
    st.integers(0, 2**45),
    st.sampled_from([-1, -(2**63), 2**63 - 1, 2**63, 2**64, True, 1.5]),
)
_partitions = st.one_of(st.integers(0, 7), st.sampled_from([-1, 2**63, 2**64, False]))
_matches = st.builds(Match, st.one_of(st.binary(max_size=30), st.just("str key")), _values, _values, _times)
_writers = st.sampled_from(["host-1:123:abc", "", 'quo"te\\', "é\U0001f600\n"])


@settings(max_examples=800, deadline=None)
@given(_writers, st.lists(st.tuples(_partitions, _matches), max_size=10))
def test_the_compiled_audit_makes_what_the_python_loop_makes(
    writer: str, feed: list[tuple[Any, Match]]
) -> None:
    assert audited(writer, feed, compiled=True) == audited(writer, feed, compiled=False)


def test_an_audit_value_holds_the_results_fingerprint() -> None:
    """The compiled value is the JSON the reference describes: partition, time, fingerprint, writer."""
    match = Match(b"a-1", b'{"x":1}', None, 1_700_000_000_000)
    made = collector("w-1")
    made.audit([(3, match)])
    key, value, headers = made.audited[3][0]
    assert (key, headers) == (b"a-1", ())
    assert orjson.loads(value) == {
        "partition": 3,
        "ts": 1_700_000_000_000,
        "fingerprint": fingerprint(b"a-1", b'{"x":1}', None, 1_700_000_000_000).hex(),
        "writer": "w-1",
    }
    assert value == output.audit_value(3, match, "w-1")
