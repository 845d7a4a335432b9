"""The whole group on one page, served by any worker: `/tandem/group` (HTML, refreshes
itself) and `/tandem/group.json` (the same for tools; `python -m assignor what-if` reads it).

The serving worker takes the leader's routing table (which member url owns each
partition: assignor/faust_adapter/routing.py), fetches every member's own `/tandem/` over HTTP
(its own view it reads in place), and puts them together: a grid of partitions by
workers (active, standby, restoring; warm-ups have a column reserved until the
assignment carries them), host and rack, lag per partition, the last rebalances, dead
letters and late records, and plots of recent throughput and lag per worker drawn as
inline SVG from each worker's history (tables/web/history.py). A member that does not
answer is shown as such; the page never waits more than `FETCH_TIMEOUT_S` for one. A
member's view is input from another process: it is read up to `MAX_VIEW_BYTES` and checked
(peer_view.py) before the page uses it, and a member whose view fails is shown as
"unreadable" with the reason. Only plain http(s)://host:port member addresses from the
current assignment's routing table are fetched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from html import escape
from typing import Any

import aiohttp
from faust.types import AppT
from faust.web import Request, Response, View
from yarl import URL

from assignor.faust_adapter import fetch_routing
from tables.runtime.worker import Runtime
from tables.web.peer_view import MAX_VIEW_BYTES, UnreadableView, parse_view
from tables.web.view import worker_view

FETCH_TIMEOUT_S = 2.0
UNREADABLE = "unreadable"  # how the page names a member whose view failed its checks
REFRESH_S = 5
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


# -- the data ------------------------------------------------------------------------------


async def group_snapshot(app: AppT, runtime: Runtime) -> dict[str, Any]:
    """Routing table, every member's view, and the grid of each join (JSON-ready)."""
    return await snapshot_of(worker_view(app, runtime), await _routing(app))


async def snapshot_of(own: dict[str, Any], routing: dict[str, Any] | None) -> dict[str, Any]:
    """The group as this worker (`own`, its view) sees it: the members the current
    assignment's routing table names, each one's view fetched and checked (peer_view.py)."""
    urls = routing["urls"] if routing else []
    own_url = _norm(own["url"])
    if own_url not in {_norm(u) for u in urls}:
        urls = [*urls, own["url"]]
    known = known_partitions(own, routing)
    fetched = await asyncio.gather(*(_fetch_view(u, known) for u in urls if _norm(u) != own_url))
    others = iter(fetched)
    workers = []
    for url in urls:
        view, error = (own, None) if _norm(url) == own_url else next(others)
        workers.append({"url": url, "ok": view is not None, "error": error, "view": view})
    workers.sort(key=lambda w: (w["view"] is None, w["view"]["worker"] if w["view"] else w["url"]))
    return {
        "served_by": own["worker"],
        "generated_at": time.time(),
        "epoch": routing["epoch"] if routing else own["epoch"],
        "routing": routing,
        "workers": workers,
        "joins": _joins(workers, routing),
        "group_rebalances": _group_rebalances(workers),
    }


def known_partitions(own: dict[str, Any], routing: dict[str, Any] | None) -> dict[str, int]:
    """topic -> partitions, as the group's assignment (else this worker) knows them: a peer's
    claim is believed up to these."""
    known = {topic: int(j["partitions"]) for j in own["joins"].values() if j.get("partitions") is not None
             for topic in j["inputs"]}  # fmt: skip
    for group in (routing or {}).get("groups", []):
        known.update(dict.fromkeys(group["topics"], int(group["partitions"])))
    return known


async def _routing(app: AppT) -> dict[str, Any] | None:
    """The leader's routing table as JSON (fetched from the leader if not here yet)."""
    assignor: Any = app.assignor  # Tandem's when it has `own_assignment` (duck typing)
    table = getattr(assignor, "routing", None)
    if table is None and hasattr(assignor, "own_assignment"):
        table = await fetch_routing(assignor, timeout=FETCH_TIMEOUT_S)
    if table is None:
        return None
    return {
        "epoch": table.epoch,
        "urls": list(table.urls),
        "groups": [
            {
                "topics": list(topics),
                "partitions": len(owners),
                "owners": [table.urls[o] if o >= 0 else None for o in owners],
            }
            for topics, owners in zip(table.groups, table.owners, strict=True)
        ],
    }


async def _fetch_view(
    url: str, known: Mapping[str, int] | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """A peer's checked view, or why there is none: "unreadable: ..." for a view that is too
    large or of the wrong shape (the page shows it as such), else why it did not answer."""
    not_a_worker = _not_a_worker_url(url)
    if not_a_worker:
        return None, f"{UNREADABLE}: {not_a_worker}"
    target = url.rstrip("/") + "/tandem/"
    try:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(target, allow_redirects=False) as response,
        ):
            if response.status != 200:
                return None, f"HTTP {response.status}"
            if (response.content_length or 0) > MAX_VIEW_BYTES:
                return None, f"{UNREADABLE}: over {MAX_VIEW_BYTES:,} bytes"
            body = await _read_at_most(response, MAX_VIEW_BYTES)
        return parse_view(body, known or {}), None
    except UnreadableView as exc:
        return None, f"{UNREADABLE}: {exc}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return None, f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or UnreadableView as soon as it passes `limit` bytes (whatever the peer's
    Content-Length said): a peer cannot make this worker hold more."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise UnreadableView(f"over {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _not_a_worker_url(url: str) -> str | None:
    """Why `url` is not a worker's web server address (None if it is one): only a plain
    http(s)://host:port is fetched, so a member cannot point the page at a path, a query or
    credentials of its choosing."""
    try:
        parsed = URL(str(url))
    except ValueError:
        return "not a URL"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "not an http(s) URL"
    if (
        parsed.user
        or parsed.password
        or parsed.query_string
        or parsed.fragment
        or parsed.path not in ("", "/")
    ):
        return "not a worker's address (http://host:port)"
    return None


def _norm(url: str) -> str:
    return str(url).rstrip("/")


def _joins(workers: list[dict[str, Any]], routing: dict[str, Any] | None) -> dict[str, Any]:
    """Per join: each partition's active, standbys and lag, as the workers report them,
    and the owner the routing table names."""
    names = sorted({n for w in workers if w["view"] for n in w["view"]["joins"]})
    return {name: _join_grid(name, workers, routing) for name in names}


def _join_grid(name: str, workers: list[dict[str, Any]], routing: dict[str, Any] | None) -> dict[str, Any]:
    # Each view's count was checked against the group's (peer_view.py), so this is bounded.
    count = max((w["view"]["joins"][name].get("partitions") or 0 for w in _with(workers, name)), default=0)
    by_url = {_norm(w["url"]): w["view"]["worker"] for w in workers if w["view"]}
    owners = _routing_owners(name, workers, routing)
    rows = []
    for partition in range(count):
        row: dict[str, Any] = {
            "partition": partition,
            "active": [],
            "restoring": [],
            "standby": [],
            "warmup": [],  # workers warming it up (KIP-441): it moves to one once caught up
            "lag": None,
            "restore": None,  # restored, to_go, rate_per_s, eta_s of a restoring active
            "standby_lag": {},
            "routing_owner": by_url.get(_norm(owners[partition]), owners[partition]) if owners else None,
        }
        for w in _with(workers, name):
            view, j = w["view"], w["view"]["joins"][name]
            if partition in j["actives"]:
                row["active"].append(view["worker"])
                row["lag"] = j["lag"].get(str(partition))
                if str(partition) in j["restoring"]:
                    row["restoring"].append(view["worker"])
                    row["restore"] = j["restoring"][str(partition)]
            if partition in j["standbys"]:
                row["standby"].append(view["worker"])
                row["standby_lag"][view["worker"]] = j["standby_lag"].get(str(partition))
            if str(partition) in j.get("warmups", {}):
                row["warmup"].append(view["worker"])
        rows.append(row)
    return {"partitions": count, "rows": rows}


def _with(workers: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [w for w in workers if w["view"] and name in w["view"]["joins"]]


def _routing_owners(name: str, workers: list[dict[str, Any]], routing: dict[str, Any] | None) -> list[str]:
    if routing is None:
        return []
    inputs: list[Any] = next((w["view"]["joins"][name]["inputs"] for w in _with(workers, name)), [])
    for group in routing["groups"]:
        if inputs and inputs[0] in group["topics"]:
            return list(group["owners"])
    return []


def _group_rebalances(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's last rebalances (each worker remembers those it saw), newest first."""
    by_epoch: dict[int, dict[str, Any]] = {}
    for w in workers:
        for entry in (w["view"] or {}).get("history", {}).get("group_rebalances", []):
            by_epoch.setdefault(entry["epoch"], entry)
    return [by_epoch[e] for e in sorted(by_epoch, reverse=True)]


# -- the page ---------------------------------------------------------------------------------

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.2em 0 .4em}
p.sub{color:#555;margin:0 0 1em}
table{border-collapse:collapse;margin-bottom:.8em;font-size:.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;white-space:nowrap}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.cell{text-align:center;min-width:4.5em}
td.active{background:#b7e1b0;font-weight:600}
td.restoring{background:#ffd89a;font-weight:600}
td.standby{background:#cfe0f5}
td.warmup{background:#e6d5f2}
td.down{background:#eee;color:#888}
.warn{color:#b00020;font-weight:600}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #ccc}
.plots{display:flex;gap:24px;flex-wrap:wrap}
svg text{font-size:11px;fill:#444}
"""


def render_group_html(snapshot: dict[str, Any]) -> str:
    """The snapshot for a person: every value formatted, nothing as a Python repr."""
    workers = snapshot["workers"]
    live = [w for w in workers if w["view"]]
    colours = {w["view"]["worker"]: COLOURS[i % len(COLOURS)] for i, w in enumerate(live)}
    parts = [
        f"<h1>Tandem group: {escape(_app_id(live))}</h1>",
        f"<p class='sub'>generation {escape(_fmt(snapshot['epoch']))} · {len(live)} of {len(workers)} "
        f"workers answering · served by {escape(snapshot['served_by'])} at "
        f"{escape(time.strftime('%H:%M:%S', time.localtime(snapshot['generated_at'])))} · "
        f"refreshes every {REFRESH_S} s · <a href='/tandem/group.json'>JSON</a></p>",
        _workers_table(workers),
        _protocol_table(live),
        _joins_table(workers),
        _plots(live, colours),
    ]
    for name, grid in snapshot["joins"].items():
        parts.append(_grid(name, grid, workers))
    parts.append(_rebalances(snapshot["group_rebalances"], live))
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{REFRESH_S}'>"
        f"<title>Tandem group {escape(_app_id(live))}</title><style>{STYLE}</style></head><body>"
        + "".join(parts)
        + "</body></html>"
    )


def _app_id(live: list[dict[str, Any]]) -> str:
    return str(live[0]["view"]["app_id"]) if live else "?"


def _fmt(value: Any) -> str:
    """A value for a person: numbers with separators, lists and maps spelled out."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "none"
    return str(value)


def _td(value: Any, numeric: bool = False) -> str:
    return f"<td{' class=num' if numeric else ''}>{escape(_fmt(value))}</td>"


def _workers_table(workers: list[dict[str, Any]]) -> str:
    head = [
        "worker", "role", "host", "rack", "url", "active", "standby", "records read", "results",
        "input lag", "counters since",
    ]  # fmt: skip
    rows = []
    for w in workers:
        view = w["view"]
        if view is None:
            state = UNREADABLE if (w["error"] or "").startswith(UNREADABLE) else "not answering"
            rows.append(
                f"<tr><td class='warn'>{state}</td><td colspan='3'></td><td>{escape(w['url'])}</td>"
                f"<td colspan='{len(head) - 5}' class='warn'>{escape(w['error'] or '')}</td></tr>"
            )
            continue
        joins = list(view["joins"].values())
        started = view.get("started_at")
        cells = [
            _td(view["worker"]), _td("leader" if view.get("leader") else "member"), _td(view["host"]),
            _td(view["rack"] or None), _td(w["url"]),
            _td(sum(len(j["actives"]) for j in joins), True),
            _td(sum(len(j["standbys"]) for j in joins), True),
            _td(sum(sum(j["read"].values()) for j in joins), True),
            _td(sum(j["results"] for j in joins), True),
            _td(sum(v or 0 for j in joins for v in j["lag"].values()), True),
            _td(time.strftime("%H:%M:%S", time.localtime(started)) if started else None),
        ]  # fmt: skip
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    note = (
        "<p class='sub'>The leader planned the last rebalance. Counters are each worker's since its "
        "process started (a restarted worker counts from 0 again; Prometheus sees the reset).</p>"
    )
    return f"<h2>Workers</h2>{note}<table><tr>{header}</tr>{''.join(rows)}</table>"


def _protocol_table(live: list[dict[str, Any]]) -> str:
    """Eager or cooperative, and in a cooperative rebalance what each worker releases, waits
    for and keeps running (topic:partition)."""
    rows = []
    for w in live:
        found = w["view"].get("rebalance_protocol")
        if not found:
            continue
        cells = [
            _td(w["view"]["worker"]),
            _td(found["setting"]),
            _td(found["announced"]),
            _td(found["group_runs"]),
        ]
        cells += [_td(", ".join(found.get(key, [])) or None) for key in ("revoked", "pending")]
        cells.append(_td(len(found.get("kept", [])), True))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        return ""
    head = [
        "worker",
        "setting",
        "announces",
        "group runs",
        "revoked (releasing)",
        "pending (coming here)",
        "kept",
    ]
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    note = (
        "<p class='sub'>TANDEM_REBALANCE_PROTOCOL: the group runs cooperative rounds once every worker "
        "announces them. In a cooperative rebalance a moving partition is revoked from its owner first "
        "and assigned in a follow-up rebalance; the kept ones keep running (docs/operations.md).</p>"
    )
    return f"<h2>Rebalance protocol</h2>{note}<table><tr>{header}</tr>{''.join(rows)}</table>"


def _joins_table(workers: list[dict[str, Any]]) -> str:
    """Each join's counters, over the workers answering (since each one's start)."""
    head = [
        "join", "kind", "how", "records read", "results", "unmatched", "input lag", "dead letters",
        "late", "duplicates", "read again", "null values", "held",
    ]  # fmt: skip
    totals: dict[str, dict[str, Any]] = {}
    for w in workers:
        for name, j in (w["view"] or {}).get("joins", {}).items():
            found = totals.setdefault(name, {"kind": j.get("kind"), "how": j.get("how"), "dead": {}, "n": {}})
            for field, value in (
                ("read", sum(j["read"].values())), ("results", j["results"]), ("unmatched", j["unmatched"]),
                ("lag", sum(v or 0 for v in j["lag"].values())), ("late", j["late"]),
                ("duplicates", j["duplicates"]), ("rereads", j.get("rereads", 0)),
                ("nulls", sum(j["null_values"].values())),
                ("held", j["held"]),
            ):  # fmt: skip
                found["n"][field] = found["n"].get(field, 0) + value
            for category, n in j["dead_letters_by_category"].items():
                found["dead"][category] = found["dead"].get(category, 0) + n
    rows = [
        "<tr>" + _td(name) + _td(t["kind"]) + _td(t["how"])
        + "".join(_td(t["n"][f], True) for f in ("read", "results", "unmatched", "lag"))
        + _td(t["dead"] or 0)
        + "".join(_td(t["n"][f], True) for f in ("late", "duplicates", "rereads", "nulls", "held"))
        + "</tr>"
        for name, t in sorted(totals.items())
    ]  # fmt: skip
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<h2>Joins</h2><table><tr>{header}</tr>{''.join(rows)}</table>"


def _grid(name: str, grid: dict[str, Any], workers: list[dict[str, Any]]) -> str:
    names = [w["view"]["worker"] if w["view"] else w["url"] for w in workers]
    down = {w["url"] for w in workers if not w["view"]}
    header = "<tr><th>partition</th>" + "".join(f"<th>{escape(n)}</th>" for n in names)
    header += "<th>input lag</th><th>routing table owner</th></tr>"
    rows = []
    for row in grid["rows"]:
        p = row["partition"]
        cells = [f"<td class=num>{p}</td>"]
        for w, worker in zip(workers, names, strict=True):
            cells.append(_grid_cell(name, p, worker, row, w["url"] in down))
        owner = row["routing_owner"]
        mismatch = owner is not None and row["active"] and owner not in row["active"]
        owner_cell = f"<td class='warn'>{escape(owner)} (differs)</td>" if mismatch else _td(owner)
        if not row["active"]:
            owner_cell = f"<td class='warn'>{escape(_fmt(owner))}: no active answering</td>"
        cells += [_td(row["lag"], True), owner_cell]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    legend = (
        "<p class='legend'><span class='active' style='background:#b7e1b0'>A active</span>"
        "<span style='background:#ffd89a'>R active, restoring</span>"
        "<span style='background:#cfe0f5'>S standby (its lag)</span>"
        "<span style='background:#e6d5f2'>W warm-up: not in the assignment yet</span></p>"
    )
    return (
        f"<h2>Join {escape(name)}: partitions × workers</h2>{legend}"
        f"<table class='grid' data-join='{escape(name)}'>{header}{''.join(rows)}</table>"
    )


def _grid_cell(join: str, partition: int, worker: str, row: dict[str, Any], down: bool) -> str:
    attrs = f"data-join='{escape(join)}' data-partition='{partition}' data-worker='{escape(worker)}'"
    if down:
        return f"<td class='cell down' {attrs} data-role='unknown'>?</td>"
    if worker in row["restoring"]:
        to_go = (row["restore"] or {}).get("to_go")
        text = "R" if to_go is None else f"R ({_fmt(to_go)} to go)"
        return f"<td class='cell restoring' {attrs} data-role='active'>{escape(text)}</td>"
    if worker in row["active"]:
        return f"<td class='cell active' {attrs} data-role='active'>A</td>"
    if worker in row["standby"]:
        lag = row["standby_lag"].get(worker)
        text = "S" if lag is None else f"S ({_fmt(lag)})"
        return f"<td class='cell standby' {attrs} data-role='standby'>{escape(text)}</td>"
    if worker in row["warmup"]:
        return f"<td class='cell warmup' {attrs} data-role='warmup'>W</td>"
    return f"<td class='cell' {attrs} data-role=''></td>"


def _rebalances(group: list[dict[str, Any]], live: list[dict[str, Any]]) -> str:
    head = "<tr><th>generation</th><th>at</th><th>protocol</th><th>tasks</th><th>kept</th>"
    head += "<th>moved warm</th><th>moved cold</th><th>planning</th></tr>"
    rows = [
        "<tr>"
        + _td(r["epoch"], True)
        + _td(time.strftime("%H:%M:%S", time.localtime(r["at"])))
        + _td(r["protocol"])
        + "".join(_td(r[k], True) for k in ("tasks", "kept", "moved_warm", "moved_cold"))
        + _td(f"{r['plan_ms']} ms")
        + "</tr>"
        for r in group
    ]
    per_worker = []
    for w in live:
        view = w["view"]
        for name, j in view["joins"].items():
            for r in reversed(j.get("rebalance_history", [])):
                per_worker.append(
                    "<tr>" + _td(view["worker"]) + _td(name) + _td(r["epoch"], True)
                    + _td(r["kept"]) + _td(r["moved_warm"]) + _td(r["moved_cold"])
                    + _td(r["replayed"], True)
                    + _td("restoring" if r["seconds"] is None else f"{r['seconds']:.2f} s") + "</tr>"
                )  # fmt: skip
    worker_head = "<tr><th>worker</th><th>join</th><th>generation</th><th>kept</th><th>moved warm</th>"
    worker_head += "<th>moved cold</th><th>changelog records replayed</th><th>restored in</th></tr>"
    tasks = (
        "<p class='sub'>A task is what the planner places: one partition of a co-partition group "
        "(partition p of a join's inputs, its changelog and its tables' changelogs, together), "
        "and one of every other topic the group reads (Faust's own, e.g. its leader topic).</p>"
    )
    return (
        "<h2>Last rebalances of the group (as the leader planned them)</h2>"
        + tasks
        + f"<table>{head}{''.join(rows) or '<tr><td colspan=8>none seen yet</td></tr>'}</table>"
        "<h2>Last rebalances on each worker (partitions)</h2>"
        f"<table>{worker_head}{''.join(per_worker)}</table>"
    )


# -- plots ------------------------------------------------------------------------------------

PLOT_W, PLOT_H, PAD_L, PAD_B = 460, 150, 56, 22


def _plots(live: list[dict[str, Any]], colours: dict[str, str]) -> str:
    throughput: dict[str, list[tuple[float, float]]] = {}
    lag: dict[str, list[tuple[float, float]]] = {}
    for w in live:
        samples = w["view"].get("history", {}).get("samples", [])
        name = w["view"]["worker"]
        throughput[name] = [
            (b["at"], max(0.0, (b["read"] - a["read"]) / (b["at"] - a["at"])))
            for a, b in zip(samples, samples[1:], strict=False)
            if b["at"] > a["at"]
        ]
        lag[name] = [(s["at"], float(s["lag"])) for s in samples]
    legend = "".join(
        f"<span style='border-color:{c};color:{c}'>■ {escape(n)}</span>" for n, c in colours.items()
    )
    return (
        f"<h2>Since the workers started</h2><p class='legend'>{legend}</p><div class='plots'>"
        + svg_plot("records read per second", throughput, colours)
        + svg_plot("input lag (records)", lag, colours)
        + "</div>"
    )


def svg_plot(title: str, series: dict[str, list[tuple[float, float]]], colours: dict[str, str]) -> str:
    """A line per worker over the same time axis, drawn as inline SVG (no script, no CDN)."""
    points = [p for s in series.values() for p in s]
    width, height = PLOT_W + PAD_L + 10, PLOT_H + PAD_B + 20
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='{escape(title)}'><title>{escape(title)}</title>",
        f"<text x='{PAD_L}' y='12'>{escape(title)}</text>",
        f"<rect x='{PAD_L}' y='18' width='{PLOT_W}' height='{PLOT_H}' fill='none' stroke='#bbb'/>",
    ]
    if not points:
        out.append(f"<text x='{PAD_L + 10}' y='{18 + PLOT_H // 2}'>no samples yet</text></svg>")
        return "".join(out)
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    top = max(max(p[1] for p in points), 1.0)
    span = max(t1 - t0, 1.0)

    def xy(t: float, v: float) -> str:
        return f"{PAD_L + (t - t0) / span * PLOT_W:.1f},{18 + PLOT_H - v / top * PLOT_H:.1f}"

    out.append(f"<text x='{PAD_L - 4}' y='26' text-anchor='end'>{escape(_short(top))}</text>")
    out.append(f"<text x='{PAD_L - 4}' y='{18 + PLOT_H}' text-anchor='end'>0</text>")
    out.append(f"<text x='{PAD_L}' y='{height - 4}'>−{span:.0f} s</text>")
    out.append(f"<text x='{PAD_L + PLOT_W}' y='{height - 4}' text-anchor='end'>now</text>")
    for name, line in series.items():
        if line:
            path = " ".join(xy(t, v) for t, v in line)
            colour = colours.get(name, "#333")
            out.append(
                f"<polyline fill='none' stroke='{colour}' stroke-width='1.6' points='{path}'>"
                f"<title>{escape(name)}</title></polyline>"
            )
    out.append("</svg>")
    return "".join(out)


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


# -- registration -------------------------------------------------------------------------------


def register_group_views(app: AppT, runtime: Runtime) -> None:
    @app.page("/tandem/group", name="tandem-group")
    async def group_html(web: View, request: Request) -> Response:
        return web.html(render_group_html(await group_snapshot(app, runtime)))

    @app.page("/tandem/group.json", name="tandem-group-json")
    async def group_json(web: View, request: Request) -> Response:
        return web.json(await group_snapshot(app, runtime))
