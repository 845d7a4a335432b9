"""Failover: SIGKILL a worker; how long until its partitions produce joins again, and
how much changelog the survivors replay. Tandem (the reference app) against the same
join on Faust's own tables with Faust's stock assignor (benchmarks/faust_table_app.py,
"faust-table"), standby replicas 0 and 1, in the same run on one embedded broker.

    .venv/bin/python benchmarks/bench_failover.py [--repeats 3] [--write docs/bench/failover.md]
    .venv/bin/python benchmarks/bench_failover.py --repeats 1 --kill w2 --preload 200000 \
        --configs tandem:1,tandem:0            # a large state: what a cold restore costs

Per run: three worker processes of one app (two host labels), 6 partitions,
steady synthetic traffic, then SIGKILL of one worker (w1, w2, w3 in turn).
"first join" is the time from the kill to the first joined record (CreateTime
after the kill) in each of the dead worker's partitions of the output topic
(keyed like the inputs, so output partition = input partition); the table shows
the slowest of them. "replayed" counts changelog records read by the survivors
to restore the dead worker's partitions (Tandem's view; for faust-table, the changelog
records Faust's table recovery applied to them); "size" is those changelog partitions'
length, what a cold restore reads.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cluster import WorkerProcess, covered, views  # noqa: E402
from app.demo import Outputs, wait_until  # noqa: E402
from app.settings import create_topics, from_env  # noqa: E402
from app.traffic import Traffic, run_traffic  # noqa: E402
from tables.testing import FAST_GROUP_SETTINGS, EmbeddedBroker, high_watermarks  # noqa: E402

PARTITIONS = 6
LABELS = [("w1", "host-a", "rack-1"), ("w2", "host-b", "rack-2"), ("w3", "host-a", "rack-1")]
# What each configuration's workers run (`faust -A <module> worker`).
APPS = {"tandem": "app", "faust-table": "benchmarks.faust_table_app"}
ALIASES = {"stock": "faust-table"}  # the former name: Faust's stock assignor


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


async def one_run(
    broker: EmbeddedBroker, config: str, standbys: int, args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:8]
    settings = dataclasses.replace(
        from_env(), app_id=f"bench-{uid}", topic_prefix=f"b{uid}-", partitions=PARTITIONS
    )
    await create_topics(broker.bootstrap, settings)
    workers = [
        WorkerProcess(
            name,
            host,
            rack,
            broker.bootstrap,
            settings.app_id,
            run_dir / uid,
            standby_replicas=standbys,
            partitions=PARTITIONS,
            topic_prefix=settings.topic_prefix,
            app_module=APPS[config],
            session_timeout_ms=args.session_ms,
            heartbeat_ms=args.heartbeat_ms,
            follower_sync_delay_ms=args.sync_delay_ms,
        )
        for name, host, rack in LABELS
    ]
    try:
        for worker in workers:
            worker.start()
        return await measure(broker.bootstrap, settings, workers, args)
    finally:
        for worker in workers:
            worker.stop(10)


async def measure(
    bootstrap: str, settings: Any, workers: list[WorkerProcess], args: argparse.Namespace
) -> dict[str, Any]:
    if not await wait_until(lambda: covered(workers, PARTITIONS), 60, 1):
        raise RuntimeError("group did not form in 60 s")
    if args.preload:
        await preload(bootstrap, settings, workers, args.preload)
    stop, stop_reader = asyncio.Event(), asyncio.Event()
    outputs = Outputs(bootstrap, settings.joins)
    reader = asyncio.create_task(outputs.run(stop_reader))
    traffic = Traffic(settings.impressions, settings.clicks, run="b", bad_every=0)
    producer = asyncio.create_task(run_traffic(bootstrap, traffic, args.rate, stop))
    await asyncio.sleep(args.warmup)
    before = await asyncio.to_thread(views, workers)
    victim = next(w for w in workers if w.name == args.victim)
    lost: list[int] = (before[victim.name] or {}).get("actives", [])
    survivors = [w for w in workers if w is not victim]
    killed_at = time.time()
    outputs.mark = killed_at
    victim.kill()
    say(f"  killed {victim.name} at {killed_at:.3f}")
    took_over = await wait_until(lambda: covered(survivors, PARTITIONS), 45, 0.05)
    takeover_s = time.time() - killed_at if took_over else None
    await wait_until(lambda: all(p in outputs.first_after for p in lost), 20, 0.05)
    after = await asyncio.to_thread(views, survivors)
    stop.set()
    await asyncio.wait_for(producer, 30)
    stop_reader.set()
    await asyncio.wait_for(reader, 10)
    changelog = next(v["changelog"] for v in after.values() if v is not None)  # the app's own
    ends = await high_watermarks(bootstrap, changelog, PARTITIONS, 15)
    sizes = {p: ends[p] for p in lost}
    result = summarize(lost, outputs, killed_at, takeover_s, after, sizes)
    result["timeline"] = {w.name: timeline(w.log_path, killed_at) for w in survivors}
    result["victim"] = victim.name
    result["before"] = _layout(workers, before)
    result["after"] = _layout(survivors, after)
    return result


# Survivor log lines that mark the steps of a takeover (aiokafka, Faust, tables/runtime/task.py).
STEPS = {
    "heartbeat": "because it is rebalancing",
    "joined": "Joined group",
    "synced": "Successfully synced group",
    "assigned": "tandem: join 'ad-join' assigned actives",
    "restored": "tandem: join 'ad-join' restored",
    "faust restored": "Restore complete!",
    "worker ready": "Worker ready",
}
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def timeline(log_path: Path, since: float) -> dict[str, float]:
    """Seconds after `since` at which a survivor's log first shows each step."""
    found: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at < since:
            continue
        for step, text in STEPS.items():
            if step not in found and text in line:
                found[step] = round(at - since, 2)
    return found


def _layout(workers: list[WorkerProcess], found: dict[str, dict[str, Any] | None]) -> str:
    """`w1@host-a a[0, 1] s[4]; ...`: actives and standbys per worker."""
    hosts = {w.name: w.host for w in workers}
    return "; ".join(
        f"{name}@{hosts[name]} a{v['actives']} s{v['standbys']}" for name, v in found.items() if v is not None
    )


async def preload(bootstrap: str, settings: Any, workers: list[WorkerProcess], count: int) -> None:
    """A large state first: `count` impressions (half clicked) as fast as the broker takes
    them, then wait until every worker has processed its input."""
    traffic = Traffic(settings.impressions, settings.clicks, run="p", bad_every=0)
    started = time.monotonic()
    await run_traffic(bootstrap, traffic, 1e6, asyncio.Event(), limit=count)

    def drained() -> bool:
        found = views(workers).values()
        # A lag of None (a partition not positioned yet) is not drained.
        return all(v is not None and all(lag == 0 for lag in v["lag"].values()) for v in found)

    if not await wait_until(drained, 600, 2):
        raise RuntimeError("preload not processed in 600 s")
    say(f"  preloaded {count} impressions in {time.monotonic() - started:.0f} s")


def summarize(
    lost: list[int],
    outputs: Outputs,
    killed_at: float,
    takeover_s: float | None,
    after: dict[str, dict[str, Any] | None],
    sizes: dict[int, int],
) -> dict[str, Any]:
    warm: list[int] = []
    cold: list[int] = []
    by_partition: dict[int, int] = {}
    for view in after.values():
        rebalance = (view or {}).get("last_rebalance", {})
        for p, n in rebalance.get("replayed_by_partition", {}).items():
            by_partition[int(p)] = n
        warm += [p for p in rebalance.get("moved_warm", []) if p in lost]
        cold += [p for p in rebalance.get("moved_cold", []) if p in lost]
    firsts = [outputs.first_after[p] - killed_at for p in lost if p in outputs.first_after]
    return {
        "lost": lost,
        "warm": sorted(warm),
        "cold": sorted(cold),
        "takeover_s": takeover_s,
        "first_join_s": max(firsts) if len(firsts) == len(lost) else None,
        "replayed": sum(by_partition.get(p, 0) for p in lost),
        "replayed_warm": sum(by_partition.get(p, 0) for p in warm),
        "replayed_cold": sum(by_partition.get(p, 0) for p in cold),
        "size": sum(sizes.values()),
        "size_cold": sum(sizes.get(p, 0) for p in cold),
    }


def fmt(value: float | None) -> str:
    return "timeout" if value is None else f"{value:.1f}"


def report(rows: list[tuple[str, int, dict[str, Any]]], args: argparse.Namespace) -> str:
    session_s = args.session_ms / 1000
    lines = [
        "| app | standbys | killed | lost partitions (warm / cold) | takeover s "
        "| first join s | replayed for warm | replayed for cold (their size) | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for app, standbys, r in rows:
        goal = r["first_join_s"] is not None and r["first_join_s"] <= session_s + 2
        goal_text = ("yes" if goal else "no") if standbys else "n/a"
        lines.append(
            f"| {app} | {standbys} | {r['victim']} | {r['lost']} ({r['warm']} / {r['cold']}) "
            f"| {fmt(r['takeover_s'])} | {fmt(r['first_join_s'])} | {r['replayed_warm']} "
            f"| {r['replayed_cold']} ({r['size_cold']}) | {goal_text} |"
        )
    lines += ["", "Placement before and after each kill (a = actives, s = standbys):", ""]
    for app, standbys, r in rows:
        lines.append(f"- {app}/{standbys}: killed {r['victim']}; before: {r['before']}; after: {r['after']}")
    lines += ["", "Survivors' logs, seconds after the kill (first line of each step):", ""]
    for app, standbys, r in rows:
        steps = "; ".join(
            f"{name} " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()) for name, t in r["timeline"].items()
        )
        lines.append(f"- {app}/{standbys}, killed {r['victim']}: {steps}")
    lines.append("")
    for app in APPS:
        for standbys in (0, 1):
            firsts = [
                r["first_join_s"]
                for a, s, r in rows
                if a == app and s == standbys and r["first_join_s"] is not None
            ]
            replays = [r["replayed"] for a, s, r in rows if a == app and s == standbys]
            if firsts:
                lines.append(
                    f"- {app}, standbys {standbys}: first join median "
                    f"{statistics.median(firsts):.1f} s, replayed median "
                    f"{statistics.median(replays):.0f} records"
                )
    lines.append(
        f"\nSession timeout {session_s:g} s, heartbeat {args.heartbeat_ms / 1000:g} s "
        f"(goal: first join within {session_s + 2:g} s); "
        f"traffic {args.rate:.0f} impressions/s, warm-up {args.warmup:.0f} s, "
        f"preload {args.preload} impressions, "
        f"{args.repeats} run(s) per configuration. tandem: the reference app (`faust -A app "
        "worker`, Tandem's assignor and join state); faust-table: the same join on a Faust Table "
        "with Faust's stock assignor and standby replicas (`faust -A benchmarks.faust_table_app "
        "worker`); its replay counts the changelog records Faust's recovery applied."
    )
    return "\n".join(lines)


async def bench(args: argparse.Namespace) -> str:
    run_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    rows: list[tuple[str, int, dict[str, Any]]] = []
    say(f"run directory (worker logs): {run_dir}")
    with EmbeddedBroker(log_dir=run_dir) as broker:
        for repeat in range(args.repeats):
            # Each repeat kills the next worker: w1 and w3 share host-a, w2 is alone on host-b.
            args.victim = args.kill or LABELS[repeat % len(LABELS)][0]
            for config in args.configs.split(","):
                name, standbys = config.split(":")[0], int(config.split(":")[1])
                app = ALIASES.get(name, name)
                if app not in APPS:
                    raise SystemExit(f"unknown configuration {name!r}: use {', '.join(APPS)}")
                say(f"run {repeat + 1}: {app} ({APPS[app]}), standby replicas {standbys}, kill {args.victim}")
                result = await one_run(broker, app, standbys, args, run_dir)
                say(f"  {result}")
                rows.append((app, standbys, result))
    return report(rows, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="each kills the next worker")
    parser.add_argument("--rate", type=float, default=60.0, help="impressions per second")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic before")
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--configs",
        default="tandem:1,tandem:0,faust-table:1,faust-table:0",
        help="app:standbys pairs, comma separated; apps: tandem, faust-table (Faust's stock assignor)",
    )
    parser.add_argument(
        "--preload", type=int, default=0, help="impressions processed before the warm-up (a large state)"
    )
    parser.add_argument("--kill", help="always kill this worker (w1, w2 or w3)")
    parser.add_argument(
        "--session-ms",
        type=int,
        default=FAST_GROUP_SETTINGS["session_timeout_ms"],
        help="the workers' session timeout (default: the embedded broker's)",
    )
    parser.add_argument("--heartbeat-ms", type=int, default=FAST_GROUP_SETTINGS["heartbeat_interval_ms"])
    parser.add_argument("--sync-delay-ms", type=int, default=FAST_GROUP_SETTINGS["follower_sync_delay_ms"])
    args = parser.parse_args()
    table = asyncio.run(bench(args))
    print(table)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(table + "\n")


if __name__ == "__main__":
    main()
