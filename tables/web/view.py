"""A worker's own view of its joins: `/tandem/` (JSON) and `/tandem/html` (a page)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from faust.types import TP, AppT
from faust.web import Request, Response, View

from tables.state.store import damage_counts
from tables.web.history import SAMPLE_EVERY_S, group_rebalance, history_of
from tables.web.metrics import register_metrics_page, worker_name

if TYPE_CHECKING:
    from tables.runtime.task import JoinRunner, Runtime


def worker_view(app: AppT, runtime: Runtime) -> dict[str, Any]:
    """This worker, its assignment and every join it runs (the JSON of /tandem/)."""
    assignor = app.assignor
    settings = getattr(assignor, "settings", None)
    host = getattr(settings, "host", "") or ""
    return {
        "worker": worker_name(app),
        "host": host,
        "rack": getattr(settings, "rack", "") or "",
        "app_id": app.conf.id,
        "url": str(app.conf.canonical_url),
        "assignor": "tandem" if hasattr(assignor, "joins") else "stock",
        "epoch": getattr(assignor, "epoch", None),
        "wire": _wire(app),
        "assignment": _assignment(app),
        "group_rebalance": group_rebalance(app),
        "probing_rebalances_asked": runtime.prober.probes,
        "joins": {name: join_view(app, runner) for name, runner in sorted(runtime.runners.items())},
        # Stores found damaged and set aside (then restored), per reason, since the process started.
        "damaged_stores": damage_counts(),
        # What this member tells the leader at a JoinGroup, and the leader's planning inputs:
        # enough to rebuild the planner's scenario (python -m assignor what-if).
        "member": _member(app),
        "planner": _planner(app),
        "history": history_of(runtime).as_dict(),
    }


def join_view(app: AppT, runner: JoinRunner) -> dict[str, Any]:
    spec, stats, state = runner.spec, runner.stats, runner.state
    actives = state.actives() if state else []
    ready = [p for p in actives if state and p in state.ready]
    operators = [state.active(p).join for p in ready] if state else []
    restoring = state.restoring() if state else {}
    return {
        "inputs": list(spec.input_topics),
        "how": spec.join_type.value,
        "window_ms": {"before": spec.window.before, "after": spec.window.after, "grace": spec.window.grace},
        "changelog": spec.changelog_topic,
        "dead_letter_topic": spec.dead_letter_topic,
        "partitions": runner.partitions,
        "actives": actives,
        "standbys": state.standbys() if state else [],
        # Warm-up replicas (KIP-441): partition -> records behind the changelog's end.
        "warmups": {str(p): lag for p, lag in state.warmup_lags().items()} if state else {},
        "restoring": {
            str(p): {
                "restored": r.restored,
                "to_go": r.to_go,
                "seconds": round(r.seconds, 3),
                "rate_per_s": round(r.rate, 1),
                "eta_s": round(r.to_go / r.rate, 1) if r.to_go is not None and r.rate > 0 else None,
            }
            for p, r in sorted(restoring.items())
        },
        "lag": {str(p): input_lag(app, runner, p) for p in actives},
        "standby_lag": {
            str(p): n for p, n in sorted(state.recovery.standby_lag.items()) if p not in state.warming
        }
        if state
        else {},
        "results": stats.results,
        "unmatched": stats.unmatched,
        "joined": {str(p): stats.results_by_partition.get(p, 0) for p in actives},
        "read": stats.read,
        "null_values": stats.null_values,
        "dead_letters": sum(stats.dead_letters.values()),
        "dead_letters_by_category": {c: n for c, n in stats.dead_letters.items() if n},
        "held": runner.aligner.held(),
        "forced": runner.aligner.forced,
        # Inputs not read for now (far ahead of their partner in event time) and what was
        # fetched of them before the pause, kept aside until they are resumed.
        "paused": sorted(f"{tp.topic}:{tp.partition}" for tp in runner.ahead),
        "deferred": sum(map(len, runner.deferred.values())),
        "late": sum(j.late for j in operators),
        "duplicates": sum(j.duplicates for j in operators),
        "handler_restarts": stats.handler_restarts,
        # Faust messages the handler queued (its tables' changelogs), produced with its output.
        "faust_sends": stats.faust_sends,
        "rebalances": runner.rebalances,
        "last_rebalance": runner.rebalance.as_dict(),
        "rebalance_history": [
            {"epoch": r.epoch, "at": r.started, **r.as_dict()} for r in runner.rebalance_history
        ],
        "events": list(state.recovery.events) if state else [],
        "failure": stats.failure,
    }


def input_lag(app: AppT, runner: JoinRunner, partition: int) -> int | None:
    """Input records not yet taken into a batch, over both inputs (None: end unknown yet)."""
    committed = getattr(app.consumer, "_committed_offset", {})
    total = 0
    for topic in runner.spec.input_topics:
        tp = TP(topic, partition)
        try:
            high = app.consumer.highwater(tp)
        except Exception:
            return None
        if high is None:
            return None
        position = runner.read_next.get(tp, committed.get(tp) or 0)
        total += max(0, high - position)
    return total


def _wire(app: AppT) -> dict[str, list[int]]:
    """The Kafka-protocol assignment this member holds, by topic."""
    found: dict[str, list[int]] = {}
    try:
        tps = app.consumer.assignment()
    except Exception:  # not started yet
        return found
    for tp in tps:
        found.setdefault(tp.topic, []).append(tp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(found.items())}


def _assignment(app: AppT) -> dict[str, dict[str, list[int]]]:
    """The assignor's view of this member (with Tandem it includes the changelogs)."""
    found: dict[str, dict[str, list[int]]] = {"active": {}, "standby": {}}
    warmups = app.assignor.warmups() if hasattr(app.assignor, "warmups") else {}
    for kind, tps in (
        ("active", app.assignor.assigned_actives()),
        ("standby", app.assignor.assigned_standbys()),  # Kafka-wise, warm-ups are standbys
    ):
        for tp in tps:
            if kind == "active" or tp.partition not in warmups.get(tp.topic, ()):
                found[kind].setdefault(tp.topic, []).append(tp.partition)
    found["warmup"] = warmups
    return {k: {t: sorted(p) for t, p in sorted(v.items())} for k, v in found.items()}


def _member(app: AppT) -> dict[str, Any] | None:
    """This member as the leader sees it (None on the stock assignor)."""
    assignor = app.assignor
    if not hasattr(assignor, "subscription"):
        return None
    state = assignor.subscription()
    consumer = _kafka_consumer(app)
    return {
        "id": getattr(getattr(consumer, "_coordinator", None), "member_id", None),
        "topics": sorted(consumer.subscription()) if consumer is not None else [],
        "epoch": state.epoch,
        "url": state.url,
        "host": state.host,
        "rack": state.rack,
        "capacity": state.capacity,
        "previous_active": state.previous_active,
        "previous_standby": state.previous_standby,
        "local_offsets": {
            topic: {str(p): offset for p, offset in sorted(by.items())}
            for topic, by in state.local_offsets.items()
        },
    }


def _kafka_consumer(app: AppT) -> Any:
    try:
        return app.consumer._thread._ensure_consumer()  # type: ignore[attr-defined]
    except Exception:  # not started yet
        return None


def _planner(app: AppT) -> dict[str, Any] | None:
    """What the leader plans with besides the members (None on the stock assignor)."""
    assignor = app.assignor
    if not hasattr(assignor, "joins"):
        return None
    settings = assignor.faust_adapter.settings
    return {
        "joins": [{"topics": list(j.topics), "changelog": j.changelog} for j in assignor.joins],
        "table_changelogs": sorted(assignor._table_changelogs()),
        "global_changelogs": sorted(assignor._global_changelogs()),
        "standby_replicas": settings.standby_replicas,
        "acceptable_recovery_lag": settings.acceptable_recovery_lag,
        "warmups": settings.warmups,
        "max_warmup_replicas": settings.max_warmup_replicas,
        "probing_rebalance_interval_s": settings.probing_rebalance_interval_s,
        "leader_url": assignor.own_assignment.leader_url,
    }


# -- the page -----------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items()) or "none"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(view: dict[str, Any]) -> str:
    """The same data as the JSON, for a person."""
    parts = [
        f"<h1>Tandem worker {escape(str(view['worker']))}</h1>",
        f"<p>app {escape(view['app_id'])} · host {escape(view['host'])} · rack {escape(view['rack'] or '—')}"
        f" · assignor {escape(view['assignor'])} · generation {escape(_cell(view['epoch']))}</p>",
    ]
    for name, j in view["joins"].items():
        rebalance = j["last_rebalance"]
        parts.append(f"<h2>Join {escape(name)}: {escape(' ⋈ '.join(j['inputs']))} ({escape(j['how'])})</h2>")
        rows = [
            ["active partitions", j["actives"]],
            ["standby partitions", j["standbys"]],
            ["restoring", j["restoring"]],
            ["input lag (records)", j["lag"]],
            ["standby lag (records)", j["standby_lag"]],
            ["warm-ups (records behind)", j.get("warmups") or "none"],
            ["results", j["results"]],
            ["dead letters", j["dead_letters_by_category"] or 0],
            [
                "late / duplicates / null values",
                f"{j['late']} / {j['duplicates']} / {sum(j['null_values'].values())}",
            ],
            ["held for event-time order", j["held"]],
            ["paused (ahead in event time)", ", ".join(j.get("paused") or []) or "none"],
            ["last rebalance: kept", rebalance["kept"]],
            ["last rebalance: moved warm", rebalance["moved_warm"]],
            ["last rebalance: moved cold", rebalance["moved_cold"]],
            ["last rebalance: replayed, seconds", f"{rebalance['replayed']}, {_cell(rebalance['seconds'])}"],
        ]
        parts.append(_table(["", ""], rows))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>"
        f"<title>Tandem worker {escape(str(view['worker']))}</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
        "table{border-collapse:collapse;margin-bottom:1em}</style></head><body>"
        + "".join(parts)
        + "</body></html>"
    )


def register_views(app: AppT, runtime: Runtime) -> None:
    """/tandem/, /tandem/html, the group page (tables/web/group_page.py) and /metrics; and the
    timer that keeps the worker's history for the group page's plots."""
    from tables.web.group_page import register_group_views

    register_metrics_page(app)
    register_group_views(app, runtime)

    @app.timer(SAMPLE_EVERY_S, name="tandem-history")
    async def sample_history() -> None:
        history_of(runtime).sample(app, runtime)

    @app.page("/tandem/", name="tandem-view")
    async def status(web: View, request: Request) -> Response:
        return web.json(worker_view(app, runtime))

    @app.page("/tandem/html", name="tandem-html")
    async def status_html(web: View, request: Request) -> Response:
        return web.html(render_html(worker_view(app, runtime)))
