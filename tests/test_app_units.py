"""The app's pieces without a broker: settings, the view, the traffic, the interim join."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.interim_join import WindowedJoin
from app.settings import from_env
from app.state import PartitionState
from app.traffic import Traffic
from app.view import render_html
from app.worker import _bootstrap, _delay_follower_sync, _tune_consumer


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_BROKER", "kafka://k1:9092;k2:9092")
    monkeypatch.setenv("TANDEM_APP_ID", "ads")
    monkeypatch.setenv("TANDEM_HOST", "host-a")
    monkeypatch.setenv("TANDEM_RACK", "rack-2")
    monkeypatch.setenv("TANDEM_STANDBY_REPLICAS", "2")
    settings = from_env()
    assert (settings.app_id, settings.host, settings.rack) == ("ads", "host-a", "rack-2")
    assert settings.standby_replicas == 2
    assert settings.changelog == "ads-join-state-changelog"
    assert _bootstrap(settings.broker) == "k1:9092,k2:9092"


def test_interim_join_inner_dedup_and_late() -> None:
    join = WindowedJoin(after=1000, grace=0)
    imp = {"event_id": "i1", "auction_id": "a", "campaign_id": "c", "ts": 1000}
    click = {"event_id": "k1", "auction_id": "a", "ts": 1500}
    assert join.process("left", imp) == []
    [result] = join.process("right", click)
    assert result["join_id"] == "i1|k1" and result["ts"] == 1500 and result["kind"] == "inner"
    assert join.process("right", click) == []  # duplicate event id
    join.process("left", {**imp, "event_id": "i2", "auction_id": "b", "ts": 9000})
    assert join.process("right", {**click, "event_id": "k2", "ts": 1900}) == []  # late
    assert join.late == 1


def test_traffic_expects_one_join_per_clicked_auction() -> None:
    traffic = Traffic("imp", "clk", run="r", bad_every=10)
    records = [r for i in range(100) for r in traffic.batch(i)] + traffic.flush_clicks()
    clicks = {json.loads(v)["event_id"] for t, _, v in records if t == "clk"}
    assert len(clicks) == len(traffic.expected)
    assert traffic.bad == 10


def test_html_view_renders_the_json_view() -> None:
    view = {
        "worker": "w1",
        "host": "host-a",
        "rack": "r",
        "app_id": "x",
        "actives": [0],
        "standbys": [1],
        "wire": {},
        "lag": {"0": 0},
        "standby_lag": {"1": 0},
        "joined": {"0": 3},
        "outputs": 3,
        "dead_letters": 0,
        "last_rebalance": {"kept": [], "moved_warm": [0], "moved_cold": [], "replayed": 2, "seconds": 1.5},
        "campaigns": {"c<1>": {"impressions": 4, "clicks": 1, "ctr": 0.25}},
    }
    html = render_html(view)
    assert "moved warm" in html and "c&lt;1&gt;" in html


def test_interim_partition_state_survives_a_torn_local_file(tmp_path: Path) -> None:
    path = tmp_path / "p0.jsonl"
    state = PartitionState(0, path)
    imp = {"event_id": "i1", "auction_id": "a", "campaign_id": "c", "ts": 1000}
    click = {"event_id": "k1", "auction_id": "a", "ts": 1500}
    state.apply(0, "left", imp)
    assert len(state.apply(1, "right", click)) == 1
    state.close()
    with path.open("a") as handle:
        handle.write('{"o": 2, "s": "le')  # a SIGKILL in the middle of a line
    again = PartitionState(0, path)
    assert again.load() == 2
    assert (again.offset, again.joined) == (1, 1)
    assert again.apply(1, "right", click) == []  # already applied: offsets are idempotent


def test_group_consumer_tuning_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_FETCH_MAX_WAIT_MS", raising=False)
    monkeypatch.delenv("TANDEM_FOLLOWER_SYNC_DELAY_MS", raising=False)
    assert (from_env().fetch_max_wait_ms, from_env().follower_sync_delay_ms) == (1500, 0)
    monkeypatch.setenv("TANDEM_FETCH_MAX_WAIT_MS", "100")
    monkeypatch.setenv("TANDEM_FOLLOWER_SYNC_DELAY_MS", "150")
    assert (from_env().fetch_max_wait_ms, from_env().follower_sync_delay_ms) == (100, 150)


def test_tuned_consumer_sets_the_fetch_wait_faust_hard_codes() -> None:
    class Thread:
        def _create_worker_consumer(self, transport: object) -> SimpleNamespace:
            return SimpleNamespace(_fetch_max_wait_ms=1500)

    class Base:
        def _new_consumer_thread(self) -> Thread:
            return Thread()

    app = SimpleNamespace(transport=SimpleNamespace(Consumer=Base))
    settings = dataclasses.replace(from_env(), fetch_max_wait_ms=100, follower_sync_delay_ms=0)
    _tune_consumer(app, settings)  # type: ignore[arg-type]
    consumer = app.transport.Consumer()._new_consumer_thread()._create_worker_consumer(None)
    assert consumer._fetch_max_wait_ms == 100


def test_follower_sync_waits_before_its_sync_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance

    called: list[float] = []

    async def original(self: object) -> bytes:
        called.append(time.monotonic())
        return b"assignment"

    monkeypatch.setattr(CoordinatorGroupRebalance, "_on_join_follower", original)
    _delay_follower_sync(0.05)
    _delay_follower_sync(0.05)  # once per process: not wrapped twice
    started = time.monotonic()
    result = asyncio.run(CoordinatorGroupRebalance._on_join_follower(object()))  # type: ignore[arg-type]
    assert result == b"assignment"
    assert len(called) == 1 and 0.05 <= called[0] - started < 0.09
