"""examples/sessions.py (a left self-join) end to end with its batch twin: users' clicks in
sessions, clicks sent twice, null values, bad records and late clicks, produced with
`pipeline.produce` (the join's partitioner, seq headers) to a broker of its own; two real
worker processes, one SIGKILLed mid-run and restarted; then `python -m pipeline join` and
`python -m pipeline reconcile --app examples.sessions` (in this process, on the shared
SparkSession) over the topic and the join's audit (issue 39, item 8).

Expected: the twin's results are those of a reference written from docs/join-semantics.md
("Self-joins"): every ordered pair (click, an earlier click of its user within 30 minutes),
never a click with itself, and every click with no such earlier click alone; the stream's
audit has each of them (nothing missing or spurious, copies only from the at-least-once
window), the dead letters alike, and the counters as sent; the Faust table of sessions per
user (read through the example's routed page) at least the reference's count, and above it
only by results handed over again. Run with `-s` to see the report.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline import join as join_command
from pipeline import reconcile
from pipeline.apps import find_join
from pipeline.produce import produce
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env, wait_for
from tests import pipeline_e2e
from tests.pipeline_e2e import encoded
from tests.spark_fixtures import spark_session

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4  # examples/sessions.py's default (SESSIONS_PARTITIONS)
MINUTE = 60_000
GAP = 30 * MINUTE  # the example's `before`
# The hour this run starts: a join dead-letters records timed over a day ahead of its clock
# (`max_future`), as a fixed time in the future would become.
T0 = int(time.time() // 3600 * 3600 * 1000)
USERS = 50
SPAN = 4 * 60 * MINUTE  # the users' clicks fall in these 4 hours


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    return spark_session()


def click(click_id: str, user: str, page: str = "/") -> dict[str, Any]:
    return {"click_id": click_id, "user": user, "page": page}


# Bad records, each with the category both sides must give it.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"side": "left", "key": "u1", "value_raw": '{"click_id": "x", "user": '}, "undecodable"),
    ({"side": "left", "key": "u2", "value": {"click_id": 7, "user": "u2", "page": "/"}}, "wrong_type"),
    ({"side": "left", "key_raw": "not-json", "value": click("bad-key", "u3")}, "undecodable"),
    ({"side": "left", "key": "u4", "value_raw": "[1, 2]"}, "wrong_type"),
]


def user_clicks(rng: random.Random, user: str) -> list[tuple[int, dict[str, Any]]]:
    """A user's sessions: 1 to 6 clicks 30 s to 8 min apart (so a long session's first and
    last click can be more than 30 minutes apart), then 20 to 90 minutes of nothing."""
    found: list[tuple[int, dict[str, Any]]] = []
    ts = T0 + rng.randint(0, 10 * MINUTE) + int(user[1:])  # distinct times: no equal-time ties
    while ts < T0 + SPAN:
        for _ in range(rng.randint(1, 6)):
            found.append((ts, click(f"{user}-{len(found)}", user, f"/page/{rng.randint(1, 9)}")))
            ts += rng.randint(30_000, 8 * MINUTE)
        ts += rng.randint(20 * MINUTE, 90 * MINUTE)
    return found


def traffic(seed: int = 11) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Wave 1, sorted by time as live producers send: every user's clicks, every 10th click
    sent again 20 s later (a duplicate by id), a few null values and bad records. What the
    twin must find: the pairs and the session starts (the reference), and the counts."""
    rng = random.Random(seed)
    clicks = [c for u in range(USERS) for c in user_clicks(rng, f"u{u}")]
    rows: list[tuple[int, dict[str, Any]]] = []
    expected: dict[str, Any] = {"duplicates": 0, "null_values": 0, "bad": {}}
    for n, (ts, value) in enumerate(clicks):
        rows.append((ts, {"side": "left", "key": value["user"], "value": value}))
        if n % 10 == 0:
            rows.append((ts + 20_000, {"side": "left", "key": value["user"], "value": value}))
            expected["duplicates"] += 1
        if n % 97 == 0:
            rows.append((ts + 3, {"side": "left", "key": f"gone{n}", "value": None}))
            expected["null_values"] += 1
        if n % 61 == 0:
            bad, category = BAD[(n // 61) % len(BAD)]
            rows.append((ts + 5, dict(bad)))
            expected["bad"][category] = expected["bad"].get(category, 0) + 1
    rows.sort(key=lambda r: r[0])
    expected["pairs"], expected["starts"] = reference(clicks)
    return [{**row, "timestamp": ts} for ts, row in rows], expected


def reference(clicks: list[tuple[int, dict[str, Any]]]) -> tuple[set[tuple[str, str]], set[str]]:
    """From docs/join-semantics.md, "Self-joins", with before=30 min and after=0: (a, b) for
    every two different clicks of a user with `a.ts - 30 min <= b.ts <= a.ts`; a click with
    none starts a session (all closed here: the ticks move stream time hours past them)."""
    by_user: dict[str, list[tuple[int, str]]] = {}
    for ts, value in clicks:
        by_user.setdefault(value["user"], []).append((ts, value["click_id"]))
    pairs: set[tuple[str, str]] = set()
    starts: set[str] = set()
    for mine in by_user.values():
        for ts_a, a in mine:
            earlier = [b for ts_b, b in mine if b != a and ts_a - GAP <= ts_b <= ts_a]
            pairs.update((a, b) for b in earlier)
            if not earlier:
                starts.add(a)
    return pairs, starts


def drained(bootstrap: str, workers: list[WorkerProcess]) -> bool:
    return pipeline_e2e.drained(bootstrap, "sessions", workers, ["clicks"], PARTITIONS)


def _covered(workers: list[WorkerProcess]) -> bool:
    return pipeline_e2e.covered(workers, "steps", PARTITIONS)


def _sessions(worker: WorkerProcess, users: dict[str, int]) -> dict[str, int]:
    """Each user's sessions started (the example's page), or {} while a worker cannot answer."""
    found = {}
    for user in users:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{worker.port}/sessions/{user}/", timeout=10
            ) as reply:
                found[user] = int(json.loads(reply.read())["sessions"])
        except OSError:
            return {}
    return found


def _all_counted(found: dict[str, int], expected: dict[str, int]) -> bool:
    return set(found) == set(expected) and all(found[u] >= n for u, n in expected.items())


def _results(worker: WorkerProcess) -> int:
    view = worker.view()
    return int(view["joins"]["steps"]["results"]) if view else 0


def test_sessions_stream_reconciles_with_its_twin_after_a_kill(spark: SparkSession, tmp_path: Path) -> None:
    spec = find_join("examples.sessions", "steps")  # the defaults: app id "sessions", 4 partitions
    assert spec.audit and spec.kind.name == "self"
    wave1, expected = traffic()
    # A click 7 hours on, of a user of its own, on every partition: stream time passes every
    # session's first click by more than its hold (2 * 30 min + grace), so each comes out.
    tick_users = {partition_for(f'"t{i}"'.encode(), PARTITIONS, "murmur2"): f"t{i}" for i in range(100)}
    ticks = [
        {"side": "left", "key": u, "value": click(f"{u}-0", u), "timestamp": T0 + 7 * 60 * MINUTE}
        for u in tick_users.values()
    ]
    assert len(ticks) == PARTITIONS
    # Then clicks older than every window: late, dropped by both sides and counted.
    late = [
        {"side": "left", "key": f"u{i}", "value": click(f"late{i}", f"u{i}"), "timestamp": T0 + i * MINUTE}
        for i in range(9)
    ]
    waves = [encoded(spec, wave1, 0)]
    waves.append(encoded(spec, ticks, len(waves[0])))
    waves.append(encoded(spec, late, len(waves[0]) + len(ticks)))

    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        asyncio.run(create_topics(broker.bootstrap, ["clicks", "click-steps"], PARTITIONS))
        env = {
            **embedded_env(),
            "SESSIONS_BROKER": f"kafka://{broker.bootstrap}",
            "TANDEM_STANDBY_REPLICAS": "1",
        }
        workers = [
            WorkerProcess(
                name,
                "examples.sessions",
                tmp_path,
                {**env, "SESSIONS_DATA_DIR": str(tmp_path / name)},
                cwd=REPO,
            )
            for name in ("w1", "w2")
        ]
        for worker in workers:
            worker.extra_env["SESSIONS_WEB_PORT"] = str(worker.port)
            worker.start()
        try:
            assert wait_for(lambda: _covered(workers), 90), "the workers did not share the partitions"
            # Sent over ~5 s, the kill lands while the workers join it.
            rate = len(waves[0]) / 5
            sender = threading.Thread(
                target=lambda: asyncio.run(produce(broker.bootstrap, spec, waves[0], rate=rate))
            )
            sender.start()
            # Killed once it has handed results over: what it did not commit is handed over
            # again, and the clicks it holds come back from the changelog (the session starts
            # come out only after the restart, when the ticks move stream time).
            assert wait_for(lambda: _results(workers[0]) > 0, 90), "the first worker joined nothing"
            workers[0].kill()
            sender.join(60)
            time.sleep(2.0)
            workers[0].start()
            for wave in waves[1:]:  # each once the stream has taken everything before it
                assert wait_for(lambda: drained(broker.bootstrap, workers), 120), "the stream lags"
                asyncio.run(produce(broker.bootstrap, spec, wave))
            assert wait_for(lambda: drained(broker.bootstrap, workers), 120), "the stream lags"
            assert wait_for(lambda: _covered(workers), 60)

            # Each user's sessions started, asked of one worker (Faust routes to the table's owner).
            by_user = {
                f"u{u}": sum(1 for c in expected["starts"] if c.startswith(f"u{u}-")) for u in range(USERS)
            }
            assert wait_for(lambda: _all_counted(_sessions(workers[1], by_user), by_user), 60)
            started = _sessions(workers[1], by_user)
            common = ["--app", "examples.sessions", "--bootstrap", broker.bootstrap, "--master", "local[2]"]
            twin_out, steps_out = tmp_path / "twin.json", tmp_path / "steps"
            assert join_command.main([*common, "--json", str(twin_out), "--out", str(steps_out)]) == 0
            twin_counts = json.loads(twin_out.read_text())
            steps = [(r["left"]["click_id"], r["right"]["click_id"] if r["right"] else None)
                     for r in spark.read.parquet(str(steps_out)).collect()]  # fmt: skip
            report_out = tmp_path / "report.json"
            status = reconcile.main(
                [*common, "--examples", "10", "--strict-counters", "--json", str(report_out)]
            )
            report = json.loads(report_out.read_text())
        finally:
            for worker in workers:
                worker.stop(15)

    results, letters, counters = report["results"], report["letters"], report["counters"]
    print(json.dumps({"results": results, "letters": letters, "counters": counters,
                      "twin": report["twin_counts"]}, indent=1))  # fmt: skip
    # The twin against the reference: every pair, every session start, nothing else.
    pairs, starts = expected["pairs"], expected["starts"]
    assert len(steps) == len(set(steps))
    assert {s for s in steps if s[1] is not None} == pairs
    assert {a for a, b in steps if b is None} == starts
    assert twin_counts["results"] == {"matched": len(pairs), "left_only": len(starts), "right_only": 0}
    assert report["twin_counts"]["results"] == twin_counts["results"]
    # The stream against the twin.
    assert status == 0 and report["ok"], report["failures"]
    assert results["missing"] == results["spurious"] == results["repeated"] == results["misplaced"] == 0
    assert results["late_by_stream_only"] == 0
    assert results["matched"] == len(pairs) + len(starts)
    assert letters["missing"] == letters["spurious"] == letters["other_category"] == 0
    assert twin_counts["dead_letters"] == dict(sorted(expected["bad"].items()))
    assert letters["matched"] == sum(expected["bad"].values())
    assert counters["twin"] == {"late": len(late), "duplicates": expected["duplicates"]}
    assert counters["stream"] == counters["twin"]  # re-reads after the kill are skipped, not counted
    assert sum(twin_counts["input"]["null_value"].values()) == expected["null_values"]
    # The table, at least once: a count above the reference only by a result handed over again.
    assert set(started) == set(by_user)
    assert sum(started.values()) - len(starts) <= results["redelivered"], (started, by_user)
