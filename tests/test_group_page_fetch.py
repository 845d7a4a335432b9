"""The group page reads other workers' views only where the group says they are: it never
follows a redirect (a worker's page cannot send it elsewhere), and gives up after a bound."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from tables.testing import free_port
from tables.web import group_page


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
