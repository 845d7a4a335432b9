"""Global-table joins on real workers (tests/apps/global_table.py): clicks keyed by click id
enriched from a campaigns table keyed by campaign id (3 partitions against the stream's 4),
looked up by a field of the click. Two workers, each holding the whole table; the table is
sent first and every worker's view reports it restored before the stream is sent; a SIGKILL
and a restart lose nothing; a campaign added while the workers run reaches every worker's
copy (its reader follows the topic) and the clicks sent after it; every result is the one
expected (none spurious), the view and /metrics agree, and `python -m pipeline reconcile`
judges both joins' audits OK against the batch twin."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from assignor import clients
from pipeline import reconcile
from tables.testing import LocalCluster, WorkerProcess
from tables.testing.workers import wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
T0 = int(time.time() // 3600 * 3600 * 1000)
CAMPAIGNS = {f"camp-{i}": f"Campaign {i}" for i in range(12)}  # "camp-missing" is not one


async def produce(bootstrap: str, rows: list[tuple[str, str, dict[str, Any] | None]]) -> None:
    producer = clients.producer(clients.settings_of(bootstrap), linger_ms=5)
    await producer.start()
    try:
        for topic, key, value in rows:
            payload = None if value is None else json.dumps(value).encode()
            await producer.send(topic, payload, key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


def tables_restored(cluster: LocalCluster, entries: int) -> bool:
    """Every live worker's view: the global table restored, read to its end, `entries` held."""
    views = [w.view(timeout=5) for w in cluster.live()]
    tables = [(v or {}).get("global_tables", {}).get("campaigns") for v in views]
    return all(t and t["restored"] and t["lag"] == 0 and t["entries"] == entries for t in tables)


def metric(worker: WorkerProcess, name: str) -> float:
    """One sample of the worker's /metrics for the campaigns table."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and 'table="campaigns"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for campaigns in /metrics")


def reconciled(bootstrap: str, join: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """`python -m pipeline reconcile` of one join: its exit status and its report."""
    out = tmp_path / f"{join}.json"
    args = ["--app", "tests.apps.global_table", "--join", join, "--bootstrap", bootstrap,
            "--master", "local[2]", "--examples", "10", "--json", str(out)]  # fmt: skip
    status = reconcile.main(args)
    return status, json.loads(out.read_text())


def test_a_stream_enriched_from_a_global_table_through_a_kill_and_a_restart(tmp_path: Path) -> None:
    table = [("campaigns", c, {"title": t}) for c, t in CAMPAIGNS.items()]
    table += [("campaigns", "camp-gone", {"title": "deleted"}), ("campaigns", "camp-gone", None)]
    names = [*CAMPAIGNS, "camp-missing", "camp-gone", "boom"]
    clicks = [
        ("clicks", f"k{n}", {"click_id": f"k{n}", "campaign": names[n % len(names)], "ts": T0 + n})
        for n in range(600)
    ]
    with LocalCluster("tests.apps.global_table", 2, run_dir=tmp_path, cwd=REPO) as c:
        asyncio.run(produce(c.bootstrap, table))
        c.wait_ready()
        assert wait_for(lambda: tables_restored(c, len(CAMPAIGNS)), 120), [w.view() for w in c.live()]
        asyncio.run(produce(c.bootstrap, clicks[:300]))
        c.workers[0].kill()
        asyncio.run(produce(c.bootstrap, clicks[300:]))
        c.wait_ready(timeout=120)
        c.add_worker(c.workers[0].name)  # the victim back, on its own files
        c.wait_ready(timeout=120)
        assert wait_for(lambda: tables_restored(c, len(CAMPAIGNS)), 120), [w.view() for w in c.live()]
        # A campaign added while the workers run: every worker's reader takes it, then the clicks.
        asyncio.run(produce(c.bootstrap, [("campaigns", "camp-new", {"title": "New"})]))
        assert wait_for(lambda: tables_restored(c, len(CAMPAIGNS) + 1), 120), [w.view() for w in c.live()]
        for worker in c.live():
            assert metric(worker, "tandem_global_table_entries") == len(CAMPAIGNS) + 1
            assert metric(worker, "tandem_global_table_restored") == 1
            assert metric(worker, "tandem_global_table_lag") == 0
        late = [
            ("clicks", f"n{n}", {"click_id": f"n{n}", "campaign": "camp-new", "ts": T0 + 1000 + n})
            for n in range(40)
        ]
        asyncio.run(produce(c.bootstrap, late))
        clicks += late
        titles = {**CAMPAIGNS, "camp-new": "New"}
        expected: set[tuple[str, str | None, str]] = set()
        for _, _, click in clicks:
            title = titles.get(click["campaign"])
            if click["campaign"] == "boom":  # the key function raised: dead-lettered by the inner join
                expected.add((click["click_id"], None, "left"))  # the left join looks up the field
                continue
            expected.add((click["click_id"], title, "left"))
            if title is not None:
                expected.add((click["click_id"], title, "inner"))

        def complete(records: list[dict[str, Any]]) -> bool:
            return {(r["click"], r["title"], r["how"]) for r in records} >= expected

        out = asyncio.run(_read(c.bootstrap, "clicks-enriched", complete, 180))
        booms = sum(1 for _, _, click in clicks if click["campaign"] == "boom")
        letters = asyncio.run(
            _read(c.bootstrap, "global-table-enriched-clicks-dead-letters", lambda rs: len(rs) >= booms, 60)
        )
        # Each result's audit record is written with the batch's output: wait for every one.
        wanted = {"enriched-clicks": sum(1 for e in expected if e[2] == "inner"), "all-clicks": len(clicks)}
        for join, count in wanted.items():
            audit = f"global-table-{join}-audit"
            asyncio.run(_read(c.bootstrap, audit, lambda rs, count=count: len(rs) >= count, 120))
        reports = {join: reconciled(c.bootstrap, join, tmp_path) for join in wanted}
    found = {(r["click"], r["title"], r["how"]) for r in out}
    assert found >= expected, f"{len(expected - found)} results lost, e.g. {sorted(expected - found)[:5]}"
    assert found <= expected, f"spurious results: {sorted(found - expected)[:5]}"
    # The key function raised: each such click dead-lettered (at least once) with the reason.
    assert len({(letter["partition"], letter["offset"]) for letter in letters}) == booms, letters[:3]
    for join, (status, report) in reports.items():
        assert status == 0 and report["ok"], (join, report["failures"], report["results"])
        assert report["results"]["missing"] == report["results"]["spurious"] == 0, report["results"]
        assert report["results"].get("global_table_changed", 0) == 0  # the table did not change under a click
    inner = {(click, title) for click, title, how in expected if how == "inner"}
    assert reports["enriched-clicks"][1]["results"]["matched"] == len(inner)
    assert reports["all-clicks"][1]["results"]["matched"] == len(clicks)
    assert reports["enriched-clicks"][1]["letters"]["matched"] == booms
    assert all(
        "lookup key function raised ValueError: no campaign 'boom'" in letter["reason"] for letter in letters
    )
