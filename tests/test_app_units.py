"""The reference app's pieces without a broker: settings, traffic, its records' rules, the page."""

from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.contract import Rejected, validate
from app.settings import from_env
from app.traffic import Traffic
from assignor.faust_adapter.group import delay_follower_sync
from assignor.faust_adapter.settings import TandemSettings
from tables.records.codecs import Accepted
from tables.web.view import render_html


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_BROKER", "kafka://k1:9092;k2:9092")
    monkeypatch.setenv("TANDEM_APP_ID", "ads")
    monkeypatch.setenv("TANDEM_HOST", "host-a")
    monkeypatch.setenv("TANDEM_RACK", "rack-2")
    monkeypatch.setenv("TANDEM_STANDBY_REPLICAS", "2")
    monkeypatch.setenv("TANDEM_FETCH_MAX_WAIT_MS", "100")
    app_settings, tandem = from_env(), TandemSettings.from_env()
    assert (app_settings.app_id, app_settings.host, tandem.rack) == ("ads", "host-a", "rack-2")
    assert app_settings.standby_replicas == 2 == tandem.standby_replicas
    assert app_settings.changelog == "ads-ad-join-changelog"
    assert app_settings.dead_letters == "ads-ad-join-dead-letters"
    assert (tandem.fetch_max_wait_ms, tandem.follower_sync_delay_ms) == (100, 0)


def test_traffic_expects_one_join_per_clicked_auction() -> None:
    traffic = Traffic("imp", "clk", run="r", bad_every=10)
    records = [r for i in range(100) for r in traffic.batch(i)] + traffic.flush_clicks()
    clicks = {json.loads(v)["event_id"] for t, _, v in records if t == "clk"}
    assert len(clicks) == len(traffic.expected)
    assert traffic.bad == 10


# -- the app's record rules agree with their plain statement (app/contract.py) ------------

DAY = 24 * 3600 * 1000


def _codecs() -> dict[str, object]:
    import app.join
    from app.settings import from_env
    from tables import runtime_of

    built = app.join.build(from_env())
    return runtime_of(built).tasks["ad-join"].intake.codecs  # type: ignore[return-value]


CODECS = _codecs()
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.sampled_from(["", "a", "é"]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["left", "right"]),
    st.fixed_dictionaries(
        {},
        optional={
            "event_id": _values,
            "auction_id": _values,
            "campaign_id": _values,
            "ts": st.one_of(_values, st.sampled_from([0, -8 * DAY, -DAY, 2 * DAY, 2**63 + 1])),
            "extra": _values,
        },
    ),
    st.sampled_from([b"a", b"", b"\xc3\xa9", b"\xff"]),
    st.sampled_from([None, b"{not json", b"[1]", b"x" * (70 * 1024)]),
)
def test_the_worker_rejects_exactly_what_the_batch_side_skips(
    side: str, record: dict[str, object], key: bytes, raw: bytes | None
) -> None:
    """The stream (the app's Faust records plus its checks, through the join's codec) and the
    plain statement of the contract (app.contract.validate, what the Faust-table baseline and the
    tests' models use) must agree on every record."""
    now = int(time.time() * 1000)
    if type(record.get("ts")) is int and abs(record["ts"]) < 10 * DAY:  # type: ignore[arg-type]
        record["ts"] = now + record["ts"]  # type: ignore[operator]
    value = raw if raw is not None and raw != b"x" * (70 * 1024) else orjson.dumps(record)
    if raw == b"x" * (70 * 1024):
        value = orjson.dumps({**record, "pad": "x" * (70 * 1024)})
    stream = CODECS[side].check(key, value, 0, now)  # type: ignore[attr-defined]
    batch = validate(side, key, value, now)  # type: ignore[arg-type]
    assert isinstance(stream, Accepted) == (not isinstance(batch, Rejected)), (stream, batch)


def test_the_page_shows_every_join_readably() -> None:
    view = {
        "worker": "w1",
        "host": "host-a",
        "rack": "r",
        "app_id": "x",
        "assignor": "tandem",
        "epoch": 3,
        "joins": {
            "clicks<1>": {
                "inputs": ["impressions", "clicks"],
                "how": "inner",
                "actives": [0],
                "standbys": [1],
                "restoring": {},
                "lag": {"0": 0},
                "standby_lag": {"1": 0},
                "results": 3,
                "dead_letters_by_category": {"undecodable": 2},
                "late": 0,
                "duplicates": 1,
                "null_values": {"left": 0, "right": 0},
                "held": 0,
                "paused": ["clicks<1>:0"],
                "last_rebalance": {
                    "kept": [],
                    "moved_warm": [0],
                    "moved_cold": [],
                    "replayed": 2,
                    "seconds": 1.5,
                },
            }
        },
    }
    html = render_html(view)
    assert "moved warm" in html and "clicks&lt;1&gt;" in html and "undecodable: 2" in html
    assert "clicks&lt;1&gt;:0" in html  # an input paused for event-time order
    assert "{" not in html.split("<style>")[0] + html.split("</style>")[1]  # no Python reprs


def test_follower_sync_waits_before_its_sync_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance

    called: list[float] = []

    async def original(self: object) -> bytes:
        called.append(time.monotonic())
        return b"assignment"

    monkeypatch.setattr(CoordinatorGroupRebalance, "_on_join_follower", original)
    delay_follower_sync(0.05)
    delay_follower_sync(0.05)  # once per process: not wrapped twice
    started = time.monotonic()
    result = asyncio.run(CoordinatorGroupRebalance._on_join_follower(object()))  # type: ignore[arg-type]
    assert result == b"assignment"
    assert len(called) == 1 and 0.05 <= called[0] - started < 0.09
