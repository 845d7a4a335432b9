"""Operations pieces without a broker: the latency buckets, Tandem's /metrics beside Faust's own
Prometheus sensors, and what-if steps on a group described as its workers describe it."""

from __future__ import annotations

import uuid
from typing import Any

import faust
import pytest
from faust.sensors.prometheus import setup_prometheus_sensors
from prometheus_client import REGISTRY, generate_latest

from assignor.faust_adapter.partition_assignor import TandemAssignor
from assignor.whatif import Change, WhatIfError, predict, render
from tables import join
from tables.web.metrics import METRICS, METRICS_PATH, LatencyBuckets
from tests.ops_checks import REPO, exposition


def test_latency_buckets_are_cumulative_in_seconds() -> None:
    buckets = LatencyBuckets()
    for ms in (5, 40, 40, 900, 7_200_000, -30):  # a future event time counts as 0
        buckets.observe_ms(ms)
    cumulative = dict(buckets.cumulative())
    assert cumulative["0.01"] == 2 and cumulative["0.05"] == 4 and cumulative["1.0"] == 5
    assert cumulative["3600.0"] == 5 and cumulative["+Inf"] == 6 == buckets.count
    assert buckets.total_ms == 5 + 40 + 40 + 900 + 7_200_000


@pytest.mark.parametrize("faust_first", [True, False])
def test_faust_sensors_and_tandem_share_one_metrics_page(faust_first: bool) -> None:
    """An app that turns on Faust's Prometheus sensors, before or after declaring a join, gets
    Faust's metrics and Tandem's on the same page (both serve the default registry)."""
    name = f"sensors-{uuid.uuid4().hex[:8]}"
    app = faust.App(name, broker="kafka://127.0.0.1:1", PartitionAssignor=TandemAssignor)
    left, right = app.topic(f"{name}-l", key_type=str), app.topic(f"{name}-r", key_type=str)
    if faust_first:
        setup_prometheus_sensors(app)

    @join(app, left, right, within=10, name=f"{name}-j")
    async def handler(results: Any) -> None:
        async for _ in results:
            pass

    if not faust_first:
        setup_prometheus_sensors(app)
    routes = [r for r in app.web.web_app.router.routes() if r.method == "GET"]
    assert any(r.resource.canonical == METRICS_PATH for r in routes)  # type: ignore[union-attr]
    page = exposition(generate_latest(REGISTRY).decode())
    prefix = name.replace("-", "_")
    assert f"{prefix}_messages_received" in page["families"]
    joins = [s.labels["join"] for s in page["samples"]["tandem_join_info"]]
    assert f"{name}-j" in joins


# -- what-if on a described group ------------------------------------------------------------------

TOPICS = ["clicks", "impressions"]
CHANGELOG = "app-j-changelog"


def _view(name: str, actives: list[int], standbys: list[int], offsets: dict[int, int]) -> dict[str, Any]:
    held = {t: actives for t in [*TOPICS, CHANGELOG]}
    return {
        "worker": name,
        "epoch": 4,
        "joins": {"j": {"inputs": TOPICS, "changelog": CHANGELOG, "actives": actives}},
        "planner": {
            "joins": [{"topics": TOPICS, "changelog": CHANGELOG}],
            "table_changelogs": [],
            "global_changelogs": [],
            "standby_replicas": 1,
            "acceptable_recovery_lag": 10_000,
            "leader_url": "http://a",
        },
        "member": {
            "id": f"member-{name}",
            "topics": TOPICS,
            "epoch": 4,
            "url": f"http://{name}",
            "host": f"host-{name}",
            "rack": "",
            "capacity": 1.0,
            "previous_active": {t: p for t, p in held.items() if p},
            "previous_standby": {CHANGELOG: standbys},
            "local_offsets": {CHANGELOG: {str(p): o for p, o in offsets.items()}},
        },
    }


def _group() -> dict[str, Any]:
    """Two workers, six partitions, each active on three and standby for the other three;
    the changelog of partition p ends at offset 100 * (p + 1) - 1, the standbys 10 behind."""
    ends = {p: 100 * (p + 1) - 1 for p in range(6)}
    a = _view("a", [0, 1, 2], [3, 4, 5], {p: ends[p] if p < 3 else ends[p] - 10 for p in range(6)})
    b = _view("b", [3, 4, 5], [0, 1, 2], {p: ends[p] if p >= 3 else ends[p] - 10 for p in range(6)})
    owners = ["http://a"] * 3 + ["http://b"] * 3
    return {
        "workers": [{"url": "http://a", "ok": True, "view": a}, {"url": "http://b", "ok": True, "view": b}],
        "routing": {
            "epoch": 4,
            "urls": ["http://a", "http://b"],
            "groups": [{"topics": sorted([*TOPICS, CHANGELOG]), "partitions": 6, "owners": owners}],
        },
    }


def test_what_if_a_worker_leaves_its_partitions_move_to_their_standbys() -> None:
    [step] = predict(_group(), Change("leave", name="b"))
    moves = {m["worker"]: m for m in step.as_dict()["joins"]["j"]}
    assert step.epoch == 5
    assert moves["a"]["kept"] == [0, 1, 2] and moves["a"]["moved_warm"] == [3, 4, 5]
    assert moves["a"]["replay"] == {"3": 10, "4": 10, "5": 10}  # the standby's lag
    assert moves["b"]["leaves"] and moves["b"]["actives_before"] == [3, 4, 5]
    assert step.group == {"tasks": 6, "kept": 3, "moved_warm": 3, "moved_cold": 0}


def test_what_if_a_worker_joins_it_takes_partitions_cold_and_the_group_stays_balanced() -> None:
    [step] = predict(_group(), Change("join", count=1, host="host-c"))
    moves = {m["worker"]: m for m in step.as_dict()["joins"]["j"]}
    new = moves["new-1"]
    assert len(new["actives_after"]) == 2 and new["moved_cold"] == new["actives_after"]
    assert new["replay"] == {str(p): 100 * (p + 1) for p in new["moved_cold"]}  # the whole changelog
    assert step.as_dict()["balance"]["j"]["spread"] == 0
    assert "new-1" in render([step]) and "Nothing was changed in the group." in render([step])


def test_what_if_a_worker_restarts_it_gets_partitions_back_warm_from_its_disk() -> None:
    stop, back = predict(_group(), Change("restart", name="a"))
    assert [stop.epoch, back.epoch] == [5, 6]
    after = {m["worker"]: m for m in back.as_dict()["joins"]["j"]}
    assert len(after["a"]["actives_after"]) == 3 and not after["a"]["moved_cold"]
    assert set(after["a"]["moved_warm"]) == set(after["a"]["actives_after"])


def test_what_if_refuses_an_unknown_worker_and_a_group_with_a_silent_member() -> None:
    with pytest.raises(WhatIfError, match="no worker named 'c'"):
        predict(_group(), Change("leave", name="c"))
    group = _group()
    group["workers"][1] = {"url": "http://b", "ok": False, "error": "timeout", "view": None}
    with pytest.raises(WhatIfError, match="not answering: http://b"):
        predict(group, Change("leave", name="a"))


def test_every_metric_is_documented() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    for name, (kind, _, _) in METRICS.items():
        shown = f"`{name}_total`" if kind == "counter" else f"`{name}`"
        assert shown in text, name
