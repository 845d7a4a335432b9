"""The readable HTML page of a worker's view (the same data as the JSON)."""

from __future__ import annotations

from html import escape
from typing import Any


def _row(cells: list[Any]) -> str:
    return "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in cells) + "</tr>"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(_row(r) for r in rows)}</table>"


def render_html(view: dict[str, Any]) -> str:
    rebalance = view["last_rebalance"]
    summary = [
        ["host / rack", f"{view['host']} / {view['rack']}"],
        ["actives", view["actives"]],
        ["standbys", view["standbys"]],
        ["wire assignment", view["wire"]],
        ["input lag (actives)", view["lag"]],
        ["standby lag (changelog)", view["standby_lag"]],
        ["joined records (actives)", view["joined"]],
        ["outputs / dead letters", f"{view['outputs']} / {view['dead_letters']}"],
        ["last rebalance: kept", rebalance["kept"]],
        ["last rebalance: moved warm", rebalance["moved_warm"]],
        ["last rebalance: moved cold", rebalance["moved_cold"]],
        ["last rebalance: replayed, seconds", f"{rebalance['replayed']}, {rebalance['seconds']}"],
        ["group's last rebalance (planner)", view.get("group_rebalance")],
    ]
    campaigns = [[c, s["impressions"], s["clicks"], s["ctr"]] for c, s in view["campaigns"].items()]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='refresh' content='2'>"
        f"<title>Tandem worker {escape(view['worker'])}</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 8px}"
        "table{border-collapse:collapse;margin-bottom:1em}</style></head><body>"
        f"<h1>Tandem worker {escape(view['worker'])} ({escape(view['app_id'])})</h1>"
        + _table(["", ""], summary)
        + "<h2>Click-through per campaign (this worker's partitions)</h2>"
        + _table(["campaign", "impressions", "clicks", "ctr"], campaigns)
        + "</body></html>"
    )
