"""The group page reads other workers' views only where the group says they are: it never
follows a redirect (a worker's page cannot send it elsewhere), and gives up after a bound."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import web

from tables.testing import free_port
from tables.web import group_page
from tables.web.peer_view import MAX_VIEW_BYTES


async def _serve(routes: web.RouteTableDef) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_a_redirect_is_not_followed() -> None:
    hits: list[str] = []
    routes = web.RouteTableDef()

    @routes.get("/tandem/")
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    @routes.get("/elsewhere")
    async def elsewhere(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"worker": "somewhere else"})

    runner, url = await _serve(routes)
    try:
        view, error = await group_page._fetch_view(url)
    finally:
        await runner.cleanup()
    assert view is None and error == "HTTP 302"
    assert hits == []


async def test_a_worker_that_does_not_answer_is_given_up_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_page, "FETCH_TIMEOUT_S", 0.5)
    routes = web.RouteTableDef()

    @routes.get("/tandem/")
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)  # past the bound below, not long
        return web.json_response({})

    runner, url = await _serve(routes)
    try:
        view, error = await asyncio.wait_for(group_page._fetch_view(url), 20)
    finally:
        await runner.cleanup()
    assert view is None and error is not None and "Timeout" in error


# -- a peer's view is input: checked for shape and size (issue 36, finding 4) -------------------

PARTITIONS = 4
TOPICS = ["impressions", "clicks", "tandem-app-ad-join-changelog"]


def _view(name: str, url: str, actives: list[int], standbys: list[int]) -> dict[str, Any]:
    """A worker's `/tandem/` view with every field the group page reads (tables/web/view.py)."""
    return {
        "worker": name,
        "host": f"host-{name}",
        "rack": "",
        "app_id": "app",
        "url": url,
        "assignor": "tandem",
        "epoch": 3,
        "leader": name == "w1",
        "started_at": time.time() - 60,
        "joins": {
            "ad-join": {
                "inputs": TOPICS[:2],
                "kind": "windowed",
                "how": "inner",
                "partitions": PARTITIONS,
                "actives": actives,
                "standbys": standbys,
                "warmups": {},
                "restoring": {},
                "lag": {str(p): 0 for p in actives},
                "standby_lag": {str(p): 1 for p in standbys},
                "results": 10,
                "unmatched": 1,
                "read": {"impressions": 20, "clicks": 10},
                "null_values": {"impressions": 0, "clicks": 0},
                "dead_letters_by_category": {"undecodable": 1},
                "held": 0,
                "late": 0,
                "duplicates": 0,
                "rereads": 0,
                "rebalance_history": [
                    {
                        "epoch": 3,
                        "at": time.time() - 30,
                        "kept": actives,
                        "moved_warm": [],
                        "moved_cold": [],
                        "replayed": 0,
                        "seconds": 0.5,
                    },
                ],  # fmt: skip
            }
        },
        "history": {
            "samples": [
                {"at": time.time() - 4, "read": 10, "results": 5, "lag": 2, "standby_lag": 0},
                {"at": time.time() - 2, "read": 30, "results": 10, "lag": 0, "standby_lag": 0},
            ],
            "group_rebalances": [
                {
                    "epoch": 3,
                    "at": time.time() - 30,
                    "protocol": "tandem",
                    "tasks": 5,
                    "kept": 4,
                    "moved_warm": 0,
                    "moved_cold": 1,
                    "plan_ms": 1.5,
                },
            ],  # fmt: skip
        },
    }


def _routing(urls: list[str], owners: list[int]) -> dict[str, Any]:
    """The routing table as group_page._routing gives it: the current assignment's members."""
    return {
        "epoch": 3,
        "urls": urls,
        "groups": [{"topics": TOPICS, "partitions": PARTITIONS, "owners": [urls[o] for o in owners]}],
    }


async def _serve_body(body: bytes, hits: list[str] | None = None) -> tuple[web.AppRunner, str]:
    """A peer on 127.0.0.1 serving `body` at any path (and noting every request in `hits`)."""
    routes = web.RouteTableDef()

    @routes.get("/{tail:.*}")
    async def anything(request: web.Request) -> web.Response:
        if hits is not None:
            hits.append(request.path_qs)
        return web.Response(body=body, content_type="application/json")

    return await _serve(routes)


async def _group_with_peer(peer_body: bytes) -> tuple[dict[str, Any], str]:
    """The group page of w1, with w2 answering well and w3 serving `peer_body`: the snapshot
    and the page rendered from it."""
    own_url, good_url = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    good_runner, good_url = await _serve_body(json.dumps(_view("w2", good_url, [1, 3], [0])).encode())
    bad_runner, bad_url = await _serve_body(peer_body)
    try:
        own = _view("w1", own_url, [0, 2], [1, 3])
        routing = _routing([own_url, good_url, bad_url], [0, 1, 0, 1])
        snapshot = await asyncio.wait_for(group_page.snapshot_of(own, routing), 30)
        html = group_page.render_group_html(snapshot)
        json.dumps(snapshot)  # the JSON page too
    finally:
        await good_runner.cleanup()
        await bad_runner.cleanup()
    return snapshot, html


def _peer(snapshot: dict[str, Any], url_port: str) -> dict[str, Any]:
    return next(w for w in snapshot["workers"] if w["url"].endswith(url_port))


def _broken(**changes: Any) -> bytes:
    """A peer view with `changes` made to it (a key set to MISSING is removed)."""
    view = _view("w3", "http://127.0.0.1:1", [], [2])
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = view
        for part in parents:
            target = target[part]
        if value is MISSING:
            del target[last]
        else:
            target[last] = value
    return json.dumps(view).encode()


MISSING = object()
WRONG_SHAPES = {
    "a list, not an object": b"[1, 2]",
    "no joins (KeyError)": _broken(joins=MISSING),
    "a join that is text (AttributeError)": _broken(joins={"ad-join": "text"}),
    "a join without actives (KeyError)": _broken(**{"joins__ad-join__actives": MISSING}),
    "more partitions than the group (IndexError)": _broken(
        **{"joins__ad-join__partitions": 8, "joins__ad-join__actives": [7]}
    ),
    "a partition that is text": _broken(**{"joins__ad-join__actives": ["0"]}),
    "a sample time that is text": _broken(
        history={"samples": [{"at": "noon", "read": 1, "lag": 0}], "group_rebalances": []}
    ),
    "a start far past any clock (OverflowError)": _broken(started_at=1e300),
    "a read count that is null": _broken(**{"joins__ad-join__read": {"clicks": None}}),
    "NaN": _broken(
        **{
            "joins__ad-join__rebalance_history": [
                {
                    "epoch": 3,
                    "kept": [],
                    "moved_warm": [],
                    "moved_cold": [],
                    "replayed": 0,
                    "seconds": float("nan"),
                }
            ]
        }
    ),
    "JSON nested too deeply (RecursionError)": b"[" * 100_000 + b"]" * 100_000,
    "not UTF-8": b'{"worker": "\xff\xfe' + bytes([0xFF, 0xFE]) + b'"}',
    "a name of a megabyte": _broken(worker="w" * 1_000_000),
}


@pytest.mark.parametrize("body", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
async def test_a_peer_view_of_the_wrong_shape_is_shown_unreadable(body: bytes) -> None:
    snapshot, html = await _group_with_peer(body)
    bad = snapshot["workers"][-1]
    assert bad["view"] is None and bad["error"].startswith("unreadable: "), bad["error"]
    assert len(bad["error"]) < 200 and "w" * 100 not in bad["error"]
    assert "unreadable" in html
    # The rest of the group is there as before: both good workers and their partitions.
    answering = {w["view"]["worker"] for w in snapshot["workers"] if w["view"]}
    assert answering == {"w1", "w2"}
    rows = snapshot["joins"]["ad-join"]["rows"]
    assert [r["active"] for r in rows] == [["w1"], ["w2"], ["w1"], ["w2"]]


async def test_a_peer_claiming_200000_partitions_gives_a_bounded_page() -> None:
    claim = {"joins__ad-join__partitions": 200_000, "joins__ad-join__actives": list(range(0, 200_000, 2))}
    for routed in (True, False):
        body = _broken(**claim)
        if not routed:  # a join the routing table does not know: the hard bound applies
            view = json.loads(body)
            view["joins"]["ad-join"]["inputs"] = ["other-left", "other-right"]
            body = json.dumps(view).encode()
        started = time.monotonic()
        snapshot, html = await _group_with_peer(body)
        bad = snapshot["workers"][-1]
        assert bad["view"] is None and "200,000 partitions" in bad["error"], bad["error"]
        assert snapshot["joins"]["ad-join"]["partitions"] == PARTITIONS
        assert len(html) < 100_000 and len(json.dumps(snapshot)) < 100_000
        print(f"routed={routed}: page {len(html):,} bytes, in {time.monotonic() - started:.2f} s")


async def test_a_peer_view_is_read_up_to_a_bound() -> None:
    """Past MAX_VIEW_BYTES the read stops, whether or not the peer declares its length."""
    routes = web.RouteTableDef()
    chunk = b" " * 65536

    @routes.get("/tandem/")
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse it by
        await response.prepare(request)
        for _ in range(2 * MAX_VIEW_BYTES // len(chunk)):
            await response.write(chunk)
        return response

    runner, url = await _serve(routes)
    try:
        view, error = await asyncio.wait_for(group_page._fetch_view(url), 30)
    finally:
        await runner.cleanup()
    assert view is None and error == f"unreadable: over {MAX_VIEW_BYTES:,} bytes"
    big = b'{"worker": "' + b"w" * (MAX_VIEW_BYTES + 10) + b'"}'
    snapshot, _ = await _group_with_peer(big)  # declared by its Content-Length
    assert snapshot["workers"][-1]["error"] == f"unreadable: over {MAX_VIEW_BYTES:,} bytes"


async def test_only_worker_addresses_of_the_current_assignment_are_fetched() -> None:
    """A member cannot point the page at a path, a query or credentials, nor at a URL named in
    its own view: only the plain http://host:port of the assignment's members is fetched."""
    hits: list[str] = []
    runner, url = await _serve_body(b"{}", hits)
    own_url = f"http://127.0.0.1:{free_port()}"
    peer_runner, peer_url = await _serve_body(json.dumps(_view("w2", url, [1, 3], [0])).encode())
    odd = [
        f"{url}/admin?drop=all",
        f"{url}/#x",
        f"http://user:pw@{url.removeprefix('http://')}",
        "file:///etc/passwd",
    ]
    try:
        own = _view("w1", own_url, [0, 2], [1, 3])
        snapshot = await asyncio.wait_for(
            group_page.snapshot_of(own, _routing([own_url, peer_url, *odd], [0, 1, 0, 1])), 30
        )
    finally:
        await runner.cleanup()
        await peer_runner.cleanup()
    assert hits == []  # neither the odd URLs nor the url w2's view names
    for w in snapshot["workers"]:
        if w["url"] in odd:
            assert w["view"] is None and w["error"].startswith("unreadable: not "), w
    assert {w["view"]["worker"] for w in snapshot["workers"] if w["view"]} == {"w1", "w2"}
    assert "unreadable" in group_page.render_group_html(snapshot)
