"""Where one join worker's time goes (issue 15): py-spy on `faust -A app worker` joining a
backlog, its samples grouped by the part of the join they fall in; prints a Markdown table.

    .venv/bin/pip install -e '.[profile]'      # py-spy (`make` does not install it)
    PYTHONPATH=. .venv/bin/python -m benchmarks.profile_worker [--impressions 500000] [--seconds 8]
    PYTHONPATH=. .venv/bin/python -m benchmarks.profile_worker --join enrich [--keys 1000000 --trades 300000]

A profile, not a benchmark: shares of the samples of both of the worker's threads (the
event loop's and Faust's consumer thread), to see what to work on; rates and CPU per
record are `benchmarks/bench_worker.py`'s. py-spy attaches to the worker process (ptrace:
as root, or with kernel.yama.ptrace_scope 0) and slows it while it samples. The compiled
parts (tables/operators/_fastjoin.pyx, _fastcheck.pyx) show as the Python frame that calls them
(py-spy reads Python stacks): `WindowedJoin.process_many`, `Intake.check`.

`--join enrich` profiles the enrichment join instead (`faust -A benchmarks.enrich_app worker`
on bench_enrich.py's input: a table of `--keys` quotes, then `--trades` trades).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from app.cluster import WorkerProcess
from app.settings import Settings, create_topics, from_env
from benchmarks import bench_enrich
from benchmarks.bench_worker import PARTITIONS, consumed, create_inputs, load_inputs
from tables.testing import EmbeddedBroker

# (area, a frame that puts a sample in it): the first area whose frame is on the sample's
# stack takes it, so the more specific come first.
AREAS = [
    ("Faust's consumer thread, busy (fetching, aiokafka's record objects)", "WorkerThread.run"),
    ("check and validation (codecs, partitioner check, the app's validate)", "Intake.check"),
    ("event-time alignment (release)", "Intake.release"),
    ("the operator (partners, index, expiry)", "WindowedJoin.process_many"),
    ("the operator (versions, pending records, lookups)", "TemporalJoin.process_many"),
    ("the app's handler and its results", "app/join.py"),
    ("the app's handler and its results", "benchmarks/enrich_app.py"),
    ("the app's handler and its results", "tables/runtime/results.py"),
    ("results and dead letters produced", "Collector.send"),
    ("changelog produced, state written to RocksDB", "JoinState.send_changes"),
    ("changelog produced, state written to RocksDB", "JoinState.write"),
    ("aiokafka's producer (requests)", "aiokafka/producer"),
    ("Faust's producer (the app's table updates)", "faust/transport/producer.py"),
    ("the rest of a batch", "JoinTask._process"),
    ("the rest: Faust, aiokafka, asyncio", ""),
]
# Single functions worth seeing on their own, as a share of all samples (on the stack).
FUNCTIONS = [
    "PartitionStore.write",  # a batch's state changes and checkpoint, one RocksDB write batch
    "PartitionStore.get",  # a partner's value read back (the compiled loop calls it)
    "PartitionStore.scan",  # the temporal join's lookups and prunes (a RocksDB iterator each)
    "JoinResults._results",  # results built for the handler (a stored partner decoded again)
    "check_event",  # the reference app's own validate
    "ad_join",  # the reference app's own output record, per result
    "Collector.audit",  # the audit records (the app's `audit=True`): a BLAKE2b per result
    "FetchResult.getall",  # the consumer thread handing out a fetch's records
    # the collection deferred to a batch's end (tables/runtime/gcpacing.py)
    "_GeneratorContextManager.__exit__",
]


IDLE = "idle: either thread waiting in select (no CPU)"


def area_of(stack: str) -> str:
    # A thread blocked in select uses no CPU: Faust's consumer thread waits there for the
    # broker's fetch responses most of the time (11 % of all samples on 2026-11-29).
    if stack.rsplit(";", 1)[-1].startswith("EpollSelector.select"):
        return IDLE
    return next(name for name, frame in AREAS if frame in stack)


def top_frames(raw: Path, within: str, count: int) -> list[tuple[str, int, int]]:
    """The `count` frames most often on the stack of the samples that have `within` on theirs,
    with their samples on the stack and at the top (where the time is spent itself)."""
    on_stack: Counter[str] = Counter()
    at_top: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not any(within in frame for frame in frames):
            continue
        below = next(i for i, frame in enumerate(frames) if within in frame)
        for frame in set(frames[below:]):
            on_stack[frame] += int(n)
        at_top[frames[-1]] += int(n)
    return [(frame, n, at_top[frame]) for frame, n in on_stack.most_common(count)]


def shares(raw: Path) -> tuple[Counter[str], Counter[str], int]:
    """Samples per area and per listed function (on the stack) in a py-spy raw file."""
    areas: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        areas[area_of(stack)] += n
        names = {frame.split(" (", 1)[0] for frame in stack.split(";")}
        for name in FUNCTIONS:
            if name in names:
                functions[name] += n
    return areas, functions, total


def _busy_share(name: str, n: int, areas: Counter[str], total: int) -> str:
    """The area's share of the samples that were not idle: of the worker's CPU time."""
    return "-" if name == IDLE else f"{n / (total - areas[IDLE]):.0%}"


def table(areas: Counter[str], functions: Counter[str], total: int, what: str, seconds: int) -> str:
    lines = [
        f"py-spy, {seconds} s at 100 samples/s of one worker joining a backlog of {what} ({total:,} samples)",
        "",
        "| area | share of samples | share of the busy ones |",
        "| --- | ---: | ---: |",
        *(
            f"| {name} | {n / total:.0%} | {_busy_share(name, n, areas, total)} |"
            for name, n in areas.most_common()
        ),
        "",
        "| function (samples with it on the stack) | share |",
        "| --- | ---: |",
        *(f"| `{name}` | {functions[name] / total:.0%} |" for name in FUNCTIONS),
    ]
    return "\n".join(lines)


async def _load(bootstrap: str, impressions: int) -> tuple[Settings, int]:
    settings = dataclasses.replace(
        from_env(), broker=f"kafka://{bootstrap}", topic_prefix="wp-", partitions=PARTITIONS, app_id="wp-join"
    )
    await create_topics(bootstrap, settings)
    return settings, await load_inputs(settings, impressions)


def profile(
    join: str,
    impressions: int,
    keys: int,
    trades: int,
    seconds: int,
    timeout: float,
    within: str | None,
    keep_raw: Path | None = None,
) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install -e '.[profile]'")
    with (
        tempfile.TemporaryDirectory(prefix="profile-worker-") as tmp,
        EmbeddedBroker(log_dir=Path(tmp)) as broker,
    ):
        if join == "enrich":
            data = asyncio.run(bench_enrich.load(broker.bootstrap, keys, trades))
            asyncio.run(create_inputs(broker.bootstrap, ["wp-out"], PARTITIONS))
            what, total = f"{keys:,} table keys and {trades:,} trades (`benchmarks.enrich_app`)", data.total
            worker = bench_enrich.worker(broker.bootstrap, "wp-enrich", Path(tmp), "tandem", "wp-out")

            def read() -> int:
                found = bench_enrich.join_of(worker.view())
                return int(sum(found["read"].values())) if found else 0
        else:
            settings, total = asyncio.run(_load(broker.bootstrap, impressions))
            what = f"{impressions:,} impressions and their clicks (`faust -A app worker`)"
            worker = WorkerProcess(
                "tandem", "host-1", "rack-1", broker.bootstrap, settings.app_id, Path(tmp),
                standby_replicas=0, partitions=PARTITIONS, topic_prefix=settings.topic_prefix,
            )  # fmt: skip

            def read() -> int:
                return consumed(worker.view(), total) or 0

        worker.start()
        try:
            deadline = time.monotonic() + timeout
            while not read():  # sampled from its first record read
                worker.check()
                if time.monotonic() > deadline:
                    raise SystemExit(f"the worker read nothing within {timeout} s (log: {worker.log_path})")
                time.sleep(0.1)
            raw = Path(tmp) / "profile.raw"
            assert worker.process is not None
            subprocess.run(
                [spy, "record", "-p", str(worker.process.pid), "-d", str(seconds), "-r", "100",
                 "-f", "raw", "-o", str(raw)],
                check=True, capture_output=True, timeout=seconds + 60,
            )  # fmt: skip
            if read() >= total:
                print("note: the backlog ran out before the profile ended (idle in it)", file=sys.stderr)
        finally:
            worker.stop(10)
        if keep_raw is not None:
            shutil.copyfile(raw, keep_raw)
        found = table(*shares(raw), what, seconds)
        if within:
            _, _, total_samples = shares(raw)
            found += f"\n\nFrames under `{within}` (share of all samples: on the stack / at its top):\n"
            found += "\n".join(
                f"- {n / total_samples:.1%} / {top / total_samples:.1%} {frame}"
                for frame, n, top in top_frames(raw, within, 30)
            )
        return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--join", choices=("windowed", "enrich"), default="windowed")
    parser.add_argument("--impressions", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=1_000_000, help="--join enrich: table keys")
    parser.add_argument("--trades", type=int, default=300_000, help="--join enrich: stream records")
    parser.add_argument("--seconds", type=int, default=8, help="how long py-spy samples")
    parser.add_argument("--timeout", type=float, default=120.0, help="for the worker's first record, seconds")
    parser.add_argument("--within", help="also list the frames under this one (e.g. Intake.check)")
    parser.add_argument("--keep-raw", type=Path, help="also keep py-spy's raw samples in this file")
    args = parser.parse_args()
    sizes = (args.impressions, args.keys, args.trades)
    print(profile(args.join, *sizes, args.seconds, args.timeout, args.within, args.keep_raw))


if __name__ == "__main__":
    main()
