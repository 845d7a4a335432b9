"""The corpus that proves warm-ups off changes nothing (tests/test_planner_warmups_off.py).

`tests/data/planner_warmups_off.jsonl.gz` holds, one JSON object a line, a scenario without
`acceptable_recovery_lag` and the exact text `python -m assignor plan` printed for it with
the planner of `main` before warm-ups existed. It was made in two steps, run from the
worktree root:

    python tests/planner_corpus.py scenarios /tmp/corpus-in.jsonl
    git archive main assignor | tar -x -C /tmp/main-planner
    PYTHONPATH=/tmp/main-planner python tests/planner_corpus.py expect /tmp/corpus-in.jsonl \\
        tests/data/planner_warmups_off.jsonl.gz

The scenarios are drawn (derandomized) from the strategies the planner's property tests
use, plus the documented example: valid, garbled and malformed scenarios, churn histories
played forward, the warm-up strategy's scenarios with their warm-up fields removed, and some
with a warm-up field but no lag (warm-ups stay off; main warned that it did not support them).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

WARMUP_FIELDS = ("acceptable_recovery_lag", "max_warmup_replicas", "changelog_end_offsets")
DOCS_EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "scenario.json"


def render(assignment: dict[str, Any]) -> str:
    """The assignment as the command line prints it."""
    return json.dumps(assignment, indent=2)


def read_corpus(path: Path) -> Iterator[tuple[Any, str]]:
    """(scenario, expected output text) of every line of the corpus."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            yield entry["scenario"], entry["output"]


def _draw(strategy: Any, count: int) -> list[Any]:
    """`count` examples of a hypothesis strategy, the same ones on every run."""
    from hypothesis import Phase, given, settings

    found: list[Any] = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None)
    @given(strategy)
    def collect(value: Any) -> None:
        found.append(json.loads(json.dumps(value)))

    collect()
    return found[:count]


def _churn_rounds(count: int) -> list[Any]:
    """Churn histories played forward with feed-back: every intermediate scenario."""
    from assignor import plan
    from tests import planner_checks as check
    from tests.planner_strategies import apply_churn, churn_histories

    found: list[Any] = []
    for scenario, events in _draw(churn_histories(), count):
        found.append(scenario)
        for event in events:
            scenario = apply_churn(check.feed_back(scenario, plan(scenario)), event)
            found.append(scenario)
    return found


def _without_warmups(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k not in WARMUP_FIELDS} for s in scenarios]


def make_scenarios() -> list[Any]:
    """The corpus's scenarios; none sets acceptable_recovery_lag."""
    from tests.planner_strategies import garbled_scenarios, malformed_scenarios, scenarios, warmup_scenarios

    sources: list[Callable[[], list[Any]]] = [
        lambda: [json.loads(DOCS_EXAMPLE.read_text(encoding="utf-8"))],
        lambda: _draw(scenarios(), 150),
        lambda: _draw(scenarios(max_members=12, max_partitions=30, uniform=True), 40),
        lambda: _draw(garbled_scenarios(), 60),
        lambda: _draw(malformed_scenarios(), 80),
        lambda: _churn_rounds(25),
        lambda: _without_warmups(_draw(warmup_scenarios(), 60)),
    ]
    found = [s for source in sources for s in source()]
    found = [s for s in found if not (isinstance(s, dict) and "acceptable_recovery_lag" in s)]
    return found + _with_stray_warmup_fields(found[1:200:4])


def _with_stray_warmup_fields(scenarios: list[Any]) -> list[Any]:
    """Scenarios with a warm-up budget or end offsets but no lag: warm-ups stay off."""
    extra = [
        {"max_warmup_replicas": 1},
        {"changelog_end_offsets": {"joins-changelog": {"0": 5}}},
        {"max_warmup_replicas": 1, "colour": "blue"},  # beside an unknown field
    ]
    return [{**s, **extra[i % 3]} for i, s in enumerate(scenarios) if isinstance(s, dict)]


def _write_scenarios(out: Path) -> None:
    with out.open("w", encoding="utf-8") as lines:
        for scenario in make_scenarios():
            lines.write(json.dumps(scenario) + "\n")


def _write_expected(scenarios: Path, out: Path) -> None:
    """Plan every scenario with the `assignor` on sys.path (main's, for the corpus)."""
    import assignor
    from assignor import plan

    print(f"planning with {assignor.__file__}", file=sys.stderr)
    with scenarios.open(encoding="utf-8") as lines, gzip.open(out, "wt", encoding="utf-8") as result:
        for line in lines:
            scenario = json.loads(line)
            result.write(json.dumps({"scenario": scenario, "output": render(plan(scenario))}) + "\n")


if __name__ == "__main__":
    command, *paths = sys.argv[1:]
    if command == "scenarios":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        _write_scenarios(Path(paths[0]))
    else:
        _write_expected(Path(paths[0]), Path(paths[1]))
