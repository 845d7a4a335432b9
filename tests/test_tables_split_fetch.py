"""A fetch is cut into batches of bounded size without losing, repeating or reordering records."""

from __future__ import annotations

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from tables.runtime.task import merge_fetches, split_fetch

TPS = [TP("left", 0), TP("right", 0), TP("left", 1), TP("right", 1)]

fetches = st.dictionaries(st.sampled_from(TPS), st.lists(st.integers(), max_size=40), max_size=len(TPS))


@given(fetches, st.integers(min_value=1, max_value=25))
def test_pieces_are_bounded_and_give_back_the_fetch(fetch: dict[TP, list[int]], limit: int) -> None:
    pieces = split_fetch(fetch, limit)  # type: ignore[arg-type]
    assert all(sum(map(len, piece.values())) <= limit for piece in pieces)
    assert all(piece for piece in pieces[1:]), "no empty piece after the first"
    assert {tp: found for tp, found in merge_fetches(pieces).items() if found} == {
        tp: found for tp, found in fetch.items() if found
    }
    total = sum(map(len, fetch.values()))
    assert len(pieces) == max(1, -(-total // limit))
