"""With warm-ups off (no `acceptable_recovery_lag`) the planner's output is byte for byte the one
of the planner before warm-ups: a corpus of scenarios with the text main's planner printed for
each (tests/planner_corpus.py says how it was made)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from assignor import plan
from tests.planner_corpus import WARMUP_FIELDS, read_corpus, render

CORPUS = Path(__file__).parent / "data" / "planner_warmups_off.jsonl.gz"
# The one line that may differ, when warm-up fields come without the lag: main said warm-ups
# were not supported; now they are, and are off. Same place, other words.
NOW_IGNORED = re.compile(
    r"warm-up fields (\[[^]]*\]) ignored: warm-ups are off without acceptable_recovery_lag"
)
MAIN_IGNORED = (
    r"warm-up fields \1 are not supported by this planner; ignored (no warm-up replicas, no pending_moves)"
)


def _difference(scenario: Any, expected: str, got: str) -> str:
    diff = difflib.unified_diff(expected.splitlines(), got.splitlines(), "main", "now", lineterm="", n=2)
    return f"scenario {scenario!r:.300}\n" + "\n".join(list(diff)[:40])


def _has_stray_warmup_fields(scenario: Any) -> bool:
    return isinstance(scenario, dict) and bool(scenario.keys() & set(WARMUP_FIELDS))


def test_every_scenario_of_the_corpus_plans_as_main_did() -> None:
    corpus = list(read_corpus(CORPUS))
    stateful = sum(1 for s, _ in corpus if isinstance(s, dict) and s.get("changelog_topics"))
    stray = sum(1 for s, _ in corpus if _has_stray_warmup_fields(s))
    assert len(corpus) >= 500 and stateful >= 200 and stray >= 40
    for scenario, expected in corpus:
        assert not (isinstance(scenario, dict) and "acceptable_recovery_lag" in scenario)
        got = render(plan(scenario))
        if _has_stray_warmup_fields(scenario):
            assert NOW_IGNORED.search(got) and "pending_moves" not in got
            got = NOW_IGNORED.sub(MAIN_IGNORED, got)
        assert got == expected, _difference(scenario, expected, got)
