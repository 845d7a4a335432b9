"""Key routing without a cluster-wide map in every assignment.

Faust's router (``app.router.route_req``) forwards a web request to the worker
that owns a key's partition; stock Faust ships the whole owner map to every
member in every assignment, which is what makes its assignments 27 MiB at
scale. Tandem's leader keeps that map (a :class:`~assignor.wire.RoutingTable`,
5 KiB for 10,000 partitions) and serves it at ``ROUTING_PATH`` on its web
server; each assignment carries only the leader's url, and every other member
fetches the table once per generation, in the background right after the
assignment. Routing needs a web server anyway, so this adds no dependency.
Until the table arrives, ``key_store`` answers for the worker's own partitions
and raises :class:`RoutingUnavailable` for the others.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import aiohttp
from faust.types import AppT
from faust.web import Request, Response, View

from assignor import wire

log = logging.getLogger(__name__)

ROUTING_PATH = "/tandem/routing/"
FETCH_TIMEOUT_S = 5.0


class RoutedAssignor(Protocol):
    """What routing reads and sets of the assignor (TandemAssignor)."""

    @property
    def routing(self) -> wire.RoutingTable | None: ...

    @property
    def own_assignment(self) -> wire.Assignment: ...

    def set_routing(self, table: wire.RoutingTable) -> None: ...


class RoutingUnavailable(KeyError):
    """The owner of a partition is not known to this worker (yet)."""


def register_view(app: AppT, assignor: RoutedAssignor) -> None:
    """Serve this worker's routing table (the leader's is the one asked for)."""

    @app.page(ROUTING_PATH, name="tandem-routing")
    class RoutingView(View):
        async def get(self, request: Request) -> Response:
            table = assignor.routing
            if table is None:
                return self.error(404, "no routing table on this worker")
            encoded = wire.encode_routing(table)
            return self.bytes(encoded, content_type="application/octet-stream")


async def fetch_routing(
    assignor: RoutedAssignor, timeout: float = FETCH_TIMEOUT_S
) -> wire.RoutingTable | None:
    """Fetch the current generation's routing table from the leader; None if it is not there."""
    own = assignor.own_assignment
    if not own.leader_url:
        return None
    url = own.leader_url.rstrip("/") + ROUTING_PATH
    try:
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with (
            aiohttp.ClientSession(timeout=client_timeout) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                return None
            table = wire.decode_routing(await response.read())
    except (TimeoutError, aiohttp.ClientError, wire.WireError) as exc:
        log.warning("routing table from %s: %s", url, exc)
        return None
    if table.epoch != own.epoch:
        return None  # the leader is already on another generation
    assignor.set_routing(table)
    return table


def prefetch(assignor: RoutedAssignor, loop: asyncio.AbstractEventLoop | None) -> None:
    """Schedule a fetch on the app's loop (called from the consumer's thread)."""
    if loop is None or not loop.is_running():
        return
    asyncio.run_coroutine_threadsafe(fetch_routing(assignor), loop)
