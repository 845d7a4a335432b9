"""Operating a live group (issue 13), on real workers of the reference app on the embedded broker:
`/metrics` and the dashboard's queries, the group page in a real headless Chromium, and the
what-if of a leave checked against what the group then does.

One group of three workers serves the module (starting one takes most of the time); the
what-if test stops a worker, so it runs last. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cluster import WorkerProcess, wait_for
from tables.testing import EmbeddedBroker
from tables.web.metrics import METRICS
from tests.ops_checks import (
    CHROMIUM,
    REPO,
    GridCells,
    chromium,
    dashboard,
    exposition,
    label_values_metric,
    metric_names,
    panel_queries,
    png_size,
    variable_queries,
)
from tests.workers import PARTITIONS, Cluster, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]
LABELS = [("w1", "host-a", "rack-1"), ("w2", "host-b", "rack-2"), ("w3", "host-a", "rack-1")]
SCREENSHOT = REPO / "docs" / "group-page.png"  # rewritten when TANDEM_UPDATE_DOCS=1


@pytest.fixture(scope="module")
def group(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    unique = uuid.uuid4().hex[:10]
    with cluster(broker, unique, tmp_path_factory.mktemp("ops")) as c:
        for name, host, rack in LABELS:
            c.worker(name, host, rack).start()
        c.wait_covered()
        traffic = c.traffic(unique)
        c.send(traffic, 300)
        assert traffic.expected <= c.joins(traffic.expected)
        yield c


def _text(worker: WorkerProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}{path}", timeout=10) as response:
        return str(response.read().decode())


def test_metrics_cover_the_view_and_the_dashboard(group: Cluster) -> None:
    worker = group.workers[0]
    page = exposition(_text(worker, "/metrics"))
    view = worker.join()
    assert view is not None
    samples = page["samples"]
    # Every metric Tandem defines is on the page (as a family; some have no sample yet), and
    # the Python process collector comes with the default registry.
    assert {name for name in METRICS} <= page["families"], sorted(set(METRICS) - page["families"])
    assert "process_cpu_seconds_total" in samples

    def value(name: str, **labels: str) -> float:
        found = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (name, labels, found)
        return float(found[0])

    # The counters are the view's counters.
    for side in ("left", "right"):
        read = value("tandem_records_read_total", join="ad-join", side=side, worker="w1")
        assert read == view["read"][side]
        let_go = value("tandem_align_let_go_total", join="ad-join", side=side, worker="w1")
        assert let_go == view["let_go"][side]
    joined = value("tandem_results_total", join="ad-join", kind="joined", worker="w1")
    assert joined == view["results"] > 0
    assert value("tandem_partitions", join="ad-join", role="active", worker="w1") == len(view["actives"])
    assert value("tandem_partitions", join="ad-join", role="standby", worker="w1") == len(view["standbys"])
    for partition in view["actives"]:
        assert value("tandem_input_lag_records", join="ad-join", partition=str(partition)) >= 0
        # Every active partition was restored once (from nothing): its restore's progress.
        assert value("tandem_restore_records_to_go", join="ad-join", partition=str(partition)) == 0
    assert value("tandem_state_bytes", join="ad-join") > 0
    count = value("tandem_output_latency_seconds_count", join="ad-join")
    assert 0 < count <= view["results"]
    assert value("tandem_output_latency_seconds_bucket", join="ad-join", le="+Inf") == count
    assert value("tandem_group_epoch") == worker.view()["epoch"]  # type: ignore[index]
    # The event loop's figures (tables/runtime/looplag.py), and the window index's records.
    stall, worst = value("tandem_event_loop_stall_seconds"), value("tandem_event_loop_worst_stall_seconds")
    assert 0 <= stall <= worst, (stall, worst)
    assert value("tandem_asyncio_tasks") > 0
    assert value("tandem_live_records", join="ad-join") >= 0
    # The window index (issue 37): its entries are the live records; its bytes in memory an estimate.
    index = view["window_index"]
    assert value("tandem_window_index_entries", join="ad-join") == index["entries"] == view["live_records"]
    assert value("tandem_window_index_bytes", join="ad-join") == index["bytes"]
    assert index["entries"] > 0 and index["bytes"] >= 100 * index["entries"], index
    # Every metric the dashboard queries is exported by this live worker.
    board = dashboard()
    queried = set().union(*(metric_names(q) for q in panel_queries(board)))
    exported = set(samples) | page["families"]
    assert queried <= exported, sorted(queried - exported)
    for query in variable_queries(board):
        metric, label = label_values_metric(query)
        assert any(label in s.labels for s in samples[metric]), query


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_group_page_in_chromium_shows_the_assignment(group: Cluster, tmp_path: Path) -> None:
    served_by = group.workers[1]
    url = f"http://127.0.0.1:{served_by.port}/tandem/group"
    # The history behind the plots (a sample every 2 s on every worker), with traffic in it.
    assert wait_for(lambda: all(len(_history(w)) >= 2 for w in group.workers), 20)
    group.send(group.traffic(uuid.uuid4().hex[:6]), 300, rate=100)
    counts = {w.name: len(_history(w)) for w in group.workers}
    assert wait_for(lambda: all(len(_history(w)) >= counts[w.name] + 2 for w in group.workers), 20)
    dom = chromium(url, tmp_path / "profile-dom", "--dump-dom")
    page = GridCells()
    page.feed(dom)
    views = {w.name: w.join() for w in group.workers}
    assert page.cells, dom[:2000]
    for (join, partition, worker), role in page.cells.items():
        assert join == "ad-join"
        own = views[worker]
        assert own is not None
        expected = "active" if partition in own["actives"] else ""
        expected = "standby" if partition in own["standbys"] else expected
        assert role == expected, (partition, worker, role, own["actives"], own["standbys"])
    assert {(p, w) for _, p, w in page.cells} == {(p, w) for p in range(PARTITIONS) for w in views}
    text = " ".join(page.text)
    for label in ("host-a", "host-b", "rack-1", "rack-2", "generation", "moved warm", "warm-up"):
        assert label in text, label
    # Who planned the last rebalance, each join's own counters, and since when they count.
    for label in ("leader", "Joins", "counters since", "A task is what the planner places"):
        assert label in text, label
    assert sum(bool((w.view() or {}).get("leader")) for w in group.workers) == 1  # one planned it
    assert page.polylines >= 2 * len(group.workers)  # throughput and lag, a line per worker
    for repr_mark in ("{'", "['", "None", "[]", "{}"):
        assert repr_mark not in text, repr_mark
    # The JSON is there for tools, with the same assignment.
    snapshot = json.loads(_text(served_by, "/tandem/group.json"))
    rows = snapshot["joins"]["ad-join"]["rows"]
    for row in rows:
        assert row["active"] == [row["routing_owner"]]
        assert row["active"] == [w for w, v in views.items() if row["partition"] in v["actives"]]  # type: ignore[index]
    shot = tmp_path / "group.png"
    chromium(url, tmp_path / "profile-shot", "--window-size=1300,1250", f"--screenshot={shot}")
    assert png_size(shot) == (1300, 1250) and shot.stat().st_size > 20_000
    if os.environ.get("TANDEM_UPDATE_DOCS") == "1":
        SCREENSHOT.write_bytes(shot.read_bytes())


def _history(worker: WorkerProcess) -> list[dict[str, Any]]:
    view = worker.view()
    return list(view["history"]["samples"]) if view else []


def test_what_if_a_worker_leaves_matches_what_the_group_does(group: Cluster) -> None:
    workers = {w.name: w for w in group.workers}
    entry = workers["w1"]
    assert wait_for(lambda: _settled(group), 30), "the group did not settle"
    before = {name: w.view() for name, w in workers.items()}
    url = f"http://127.0.0.1:{entry.port}"
    printed = _what_if(url, "--leave", "w2")
    assert "w2 leaves" in printed and "Nothing was changed in the group." in printed, printed
    # The leave's own round (probing rebalances may follow it when a move waits for a warm-up).
    step = json.loads(_what_if(url, "--leave", "w2", "--json"))[0]
    # The what-if changed nothing: same generation, no rebalance.
    for name, w in workers.items():
        now = w.view()
        assert now is not None and now["epoch"] == before[name]["epoch"]  # type: ignore[index]
        assert now["joins"]["ad-join"]["rebalances"] == before[name]["joins"]["ad-join"]["rebalances"]  # type: ignore[index]
    predicted = {m["worker"]: m for m in step["joins"]["ad-join"]}
    assert predicted["w2"]["leaves"] and predicted["w2"]["actives_before"]
    workers["w2"].stop()  # a clean leave (SIGTERM)
    group.wait_covered(timeout=45)
    survivors = ("w1", "w3")
    assert wait_for(lambda: all(_rebalance(workers[n], step["epoch"]) for n in survivors), 20)
    for name in survivors:
        done = _rebalance(workers[name], step["epoch"])
        guess = predicted[name]
        assert done is not None
        for kind in ("kept", "moved_warm", "moved_cold"):
            assert done[kind] == guess[kind], (name, kind, done, guess)
        assert done["replayed_by_partition"] == guess["replay"], (name, done, guess)
        view = workers[name].join()
        assert view is not None
        assert view["actives"] == guess["actives_after"] and view["standbys"] == guess["standbys_after"]
    assert sorted(p for n in survivors for p in predicted[n]["actives_after"]) == list(range(PARTITIONS))
    # The leader's own count of the rebalance (every task of the group) is the predicted one.
    assert wait_for(lambda: _group_rebalance(workers["w1"], step["epoch"]), 10)
    planned = _group_rebalance(workers["w1"], step["epoch"])
    assert planned is not None
    for kind in ("tasks", "kept", "moved_warm", "moved_cold"):
        assert planned[kind] == step["group"][kind], (kind, planned, step["group"])


def _what_if(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "assignor", "what-if", "--worker", url, *args],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _settled(group: Cluster) -> bool:
    """Nothing in flight: no input lag, and every standby and the offsets each member would
    report to the leader equal to the active's (the assignor's copy is refreshed every 2 s)."""
    offsets: dict[str, dict[str, int]] = {}
    for worker in group.live():
        view = worker.view()
        if view is None:
            return False
        join = view["joins"]["ad-join"]
        # A lag of None is not known yet (a partition just assigned): not settled either.
        lags = [*join["lag"].values(), *join["standby_lag"].values()]
        if any(lag != 0 for lag in lags) or join["held"]:
            return False
        held = {str(p) for p in join["actives"] + join["standbys"]}
        for partition, offset in view["member"]["local_offsets"].get(group.settings.changelog, {}).items():
            if partition in held:  # not files kept from an older assignment
                offsets.setdefault(partition, {})[worker.name] = offset
    return all(len(set(by.values())) == 1 for by in offsets.values())


def _rebalance(worker: WorkerProcess, epoch: int) -> dict[str, Any] | None:
    """The worker's rebalance of generation `epoch`, once restored."""
    view = worker.join()
    for entry in (view or {}).get("rebalance_history", []):
        if entry["epoch"] == epoch and entry["seconds"] is not None:
            return dict(entry)
    return None


def _group_rebalance(worker: WorkerProcess, epoch: int) -> dict[str, Any] | None:
    view = worker.view()
    for entry in (view or {}).get("history", {}).get("group_rebalances", []):
        if entry["epoch"] == epoch:
            return dict(entry)
    return None
