"""A worker's own view of its joins: `/tandem/` (JSON) and `/tandem/html` (a page)."""

from __future__ import annotations

import sys
import time
from html import escape
from typing import Any

from faust.types import TP, AppT
from faust.web import Request, Response, View

from tables.kafka.consumer import kafka_consumer, member_id
from tables.runtime.looplag import running_tasks
from tables.runtime.task import JoinTask
from tables.runtime.worker import Runtime
from tables.state.store import damage_counts, shared_memory
from tables.web.history import SAMPLE_EVERY_S, group_rebalance, history_of
from tables.web.metrics import worker_name

STARTED_AT = time.time()  # when this process imported Tandem's pages: the counters' origin


def _rebalance_protocol(assignor: Any) -> dict[str, Any] | None:
    view = getattr(assignor, "cooperative_view", None)
    return view() if view is not None else None


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
        # Whether this worker led the group's last rebalance (planned the assignment).
        "leader": bool(getattr(assignor, "led_last_round", False)),
        # Counters are since this moment (the process's start): they start at 0 on a restart.
        "started_at": STARTED_AT,
        "wire": _wire(app),
        "assignment": _assignment(app),
        "group_rebalance": group_rebalance(app),
        # eager or cooperative (TANDEM_REBALANCE_PROTOCOL), and in a cooperative rebalance the
        # partitions this worker revokes, gets in the follow-up (pending) and keeps running.
        "rebalance_protocol": _rebalance_protocol(assignor),
        "probing_rebalances_asked": runtime.prober.probes,
        "joins": {name: join_view(task) for name, task in sorted(runtime.tasks.items())},
        # Global tables this worker holds whole: restore progress, the reader's lag, entries.
        "global_tables": {topic: table.status() for topic, table in sorted(runtime.global_tables.items())},
        # Stores found damaged and set aside (then restored), per reason, since the process started.
        "damaged_stores": damage_counts(),
        # The app's Faust table stores set aside (then rebuilt by Faust), per table and reason,
        # and the last of them (tables/state/faust_stores.py).
        "damaged_faust_stores": runtime.faust_stores.damage_counts(),
        "faust_store_events": list(runtime.faust_stores.events),
        # What this member tells the leader at a JoinGroup, and the leader's planning inputs:
        # enough to rebuild the planner's scenario (python -m assignor what-if).
        "member": _member(app),
        "planner": _planner(app),
        "history": history_of(runtime).as_dict(),
        "loop": loop_view(runtime),
        "memory": memory_view(),
    }


def memory_view() -> dict[str, int]:
    """What this process's memory holds, in the parts Tandem can name: Python's allocated
    blocks (a count) and the RocksDB memory the join stores share (bytes)."""
    rocksdb = shared_memory()
    return {
        "python_blocks": sys.getallocatedblocks(),
        "rocksdb_block_cache_bytes": rocksdb["block_cache"],
        "rocksdb_memtables_bytes": rocksdb["memtables"],
    }


def loop_view(runtime: Runtime) -> dict[str, Any]:
    """The event loop: its longest stall in the last seconds and since the start, its tasks."""
    lag = runtime.loop_lag
    return {
        "stall_s": round(lag.longest(), 4),
        "stall_window_s": lag.window_s,
        "worst_stall_s": round(lag.worst, 4),
        "asyncio_tasks": running_tasks(),
    }


def input_offsets(task: JoinTask, actives: list[int]) -> dict[str, dict[str, int | None]]:
    """Per active input partition ("topic:partition"): the next offset the join reads
    (`read_next`), the offset it lets the group commit (`commit_at`: never past a record it
    still holds) and the one this worker last committed (`committed`). A partition whose
    `committed` stays behind `commit_at` is one whose commits the broker refuses; one whose
    `read_next` stays put while its lag grows is not being fetched. None: not known yet."""
    intake = task.intake
    committed = intake.offsets.committed()
    found: dict[str, dict[str, int | None]] = {}
    for topic in task.spec.topics:
        for partition in actives:
            tp = TP(topic, partition)
            found[f"{topic}:{partition}"] = {
                "read_next": intake.read_next.get(tp),
                "commit_at": intake.commit_at.get(tp),
                "committed": committed.get(tp),
            }
    return found


def join_view(task: JoinTask) -> dict[str, Any]:
    """One join on this worker: its partitions, restores, lag, counters and rebalances."""
    spec, stats, state, held = task.spec, task.stats, task.state, task.input_snapshot()
    actives = state.actives() if state else []
    restoring = state.restoring() if state else {}
    counts = task.counters()
    return {
        "inputs": list(spec.input_topics),
        # A rekeyed input: side -> its source topic, its repartition topic, records produced there.
        "rekeyed": {
            r.side: {"source": r.source.name, "topic": r.name, "records": stats.rekeyed[r.side]}
            for r in spec.repartitions
        },
        **spec.kind.describe(),
        "changelog": spec.changelog_topic,
        "dead_letter_topic": spec.dead_letter_topic,
        "partitions": task.partitions,
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
        "lag": {str(p): task.input_lag(p) for p in actives},
        "offsets": input_offsets(task, actives),
        "standby_lag": {
            str(p): n for p, n in sorted(state.recovery.standby_lag.items()) if p not in state.warming
        }
        if state
        else {},
        "results": stats.results,
        "unmatched": stats.unmatched,
        "idle_results": stats.idle_results,  # released by an idle partition's clock (`idle`)
        "joined": {str(p): stats.results_by_partition.get(p, 0) for p in actives},
        "read": stats.read,
        "null_values": stats.null_values,
        "dead_letters": sum(stats.dead_letters.values()),
        "dead_letters_by_category": {c: n for c, n in stats.dead_letters.items() if n},
        "dead_letters_skipped": stats.letters_skipped,  # too large for the producer even when cut
        "held": held.held,
        # Records the ready active partitions hold in memory (the windowed join's index).
        "live_records": held.live_records,
        # The windowed join's index of them: entries, and bytes in memory (None: no such index).
        "window_index": held.window_index,
        "forced": held.forced,
        # Per side: times its wait for event-time order ran out (TANDEM_ALIGN_MAX_WAIT_MS) and its
        # partner went on without it; while all are 0 the order was exact (docs/pipeline.md).
        "let_go": held.let_go,
        # Inputs not read for now (far ahead of their partner in event time) and what was
        # fetched of them before the pause, kept aside until they are resumed.
        "paused": held.paused,
        "deferred": held.deferred,
        "late": counts.get("late", 0),
        "duplicates": counts.get("duplicates", 0),
        # Records read again that the state already held (restarts, rebalances): not duplicates.
        "rereads": sum(stats.rereads.values()),
        "operator_counters": counts,  # every counter of the join's kind (e.g. late_updates)
        "handler_restarts": stats.handler_restarts,
        # Faust messages the handler queued (its tables' changelogs), produced with its output.
        "faust_sends": stats.faust_sends,
        "rebalances": task.rebalances,
        "last_rebalance": task.rebalance.as_dict(),
        "rebalance_history": [
            {"epoch": r.epoch, "at": r.started, **r.as_dict()} for r in task.rebalance_history
        ],
        "events": list(state.recovery.events) if state else [],
        "failure": stats.failure,
    }


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
    consumer = kafka_consumer(app)
    return {
        "id": member_id(app),
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


def _plans_cooperative(assignor: Any) -> bool:
    """Whether the leader's next round is cooperative, as far as this member knows: it announces
    cooperative rounds (as every member of a settled group does) or the last round was one."""
    return bool(getattr(assignor, "runs_cooperative", False) or getattr(assignor, "cooperative_round", False))


def _planner(app: AppT) -> dict[str, Any] | None:
    """What the leader plans with besides the members (None on the stock assignor)."""
    assignor: Any = app.assignor  # Tandem's when it has `joins`; Faust's type does not declare them
    if not hasattr(assignor, "joins"):
        return None
    settings = assignor.settings
    return {
        "joins": [{"topics": list(j.topics), "changelog": j.changelog} for j in assignor.joins],
        "table_changelogs": sorted(assignor.table_changelogs()),
        "global_changelogs": sorted(assignor.global_changelogs()),
        "standby_replicas": settings.standby_replicas,
        # The protocol the leader names in its scenario: "cooperative" when members announce
        # cooperative rounds or the group's last round was one, else none (an eager round names
        # no protocol, and the planner's ties depend on whether one is named), so the what-if
        # plans as the leader does.
        "protocol": "cooperative" if _plans_cooperative(assignor) else None,
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


def _when(at: float | None) -> str:
    return "—" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def render_html(view: dict[str, Any]) -> str:
    """The same data as the JSON, for a person."""
    parts = [
        f"<h1>Tandem worker {escape(str(view['worker']))}</h1>",
        f"<p>app {escape(view['app_id'])} · host {escape(view['host'])} · rack {escape(view['rack'] or '—')}"
        f" · assignor {escape(view['assignor'])} · generation {escape(_cell(view['epoch']))}"
        f"{' · the group leader' if view.get('leader') else ''}</p>",
        f"<p>counters since {escape(_when(view.get('started_at')))} (this process's start)</p>",
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
            ["read again, already joined (since start)", j.get("rereads", 0)],
            ["operator counters", j.get("operator_counters") or "none"],
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
    """/tandem/ and /tandem/html, and the timer that keeps the worker's history for the group
    page's plots."""

    @app.timer(SAMPLE_EVERY_S, name="tandem-history")
    async def sample_history() -> None:
        history_of(runtime).sample(app, runtime)

    @app.page("/tandem/", name="tandem-view")
    async def status(web: View, request: Request) -> Response:
        return web.json(worker_view(app, runtime))

    @app.page("/tandem/html", name="tandem-html")
    async def status_html(web: View, request: Request) -> Response:
        return web.html(render_html(worker_view(app, runtime)))
