"""What the store's fault handling costs; prints Markdown tables (results: docs/tables.md).

    .venv/bin/python -m benchmarks.bench_store [--dir /path/on/the/disk/to/measure]

1. The assignor's read of a closed store's checkpoint: RocksDB opened read-only
   (`PartitionStore.read_checkpoint`) against the hint file (`safe_checkpoint`), for
   stores closed cleanly and stores whose process was killed (state still in the WAL,
   which a read-only open replays).
2. The hint's cost per commit: `PartitionStore.write` of 10 keys and a checkpoint (RocksDB
   batch + hint pwrite) against the same RocksDB batch alone (the write before the hint),
   and against the hint written the usual safe way (temporary file + rename).
3. The status check a scan now makes: a one-key `PartitionStore.scan` against the scan as
   it was before (the same generator without `status()`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rocksdict import ReadOptions, WriteBatch

from tables.state.store import CHECKPOINT_KEY, PartitionStore, encode_checkpoint, safe_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def per_call_us(call: Callable[[int], object], repeat: int) -> float:
    """Median wall time of one call, in microseconds."""
    times = []
    for n in range(repeat):
        start = time.perf_counter()
        call(n)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def make_store(path: Path, records: int, killed: bool) -> None:
    """A store of `records` 16-byte keys with 100-byte values, written in batches of 1,000
    by a child process that closes it, or is killed without closing."""
    end = "os.kill(os.getpid(), 9)" if killed else "store.close()"
    code = (
        "import os\nfrom tables.state.store import PartitionStore\n"
        f"store = PartitionStore({str(path)!r})\n"
        f"for batch in range({max(records // 1000, 1)}):\n"
        "    store.write({os.urandom(16): os.urandom(100) for _ in range(1000)}, batch)\n"
        f"{end}\n"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


def checkpoint_reads(work: Path) -> None:
    print("| store | files | read-only RocksDB open (ms) | hint file (ms) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for records in (1_000, 100_000):
        for killed in (False, True):
            path = work / f"{records}-{'killed' if killed else 'closed'}" / "0"
            make_store(path, records, killed)
            size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
            rocks = per_call_us(lambda _n, p=path: PartitionStore.read_checkpoint(p), 20) / 1e3
            hint = per_call_us(lambda _n, p=path: safe_checkpoint(p), 2000) / 1e3
            state = "process killed" if killed else "closed"
            ratio = f"{rocks / hint:,.0f}x"
            row(f"{records:,} records, {state}", f"{size:.1f} MB", f"{rocks:.2f}", f"{hint:.3f}", ratio)


def hint_cost(work: Path) -> None:
    store = PartitionStore(work / "writes" / "0")
    changes = {os.urandom(16): os.urandom(100) for _ in range(10)}

    def without_hint(n: int) -> None:  # what write() did before the hint: one RocksDB batch
        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            batch.put(key, value)
        batch.put(CHECKPOINT_KEY, encode_checkpoint(n))
        store._db.write(batch, store._write_options)

    side, tmp = work / "renamed-hint", work / "renamed-hint.tmp"

    def renamed_hint(n: int) -> None:
        without_hint(n)
        tmp.write_bytes(b"%d\n" % n)
        os.replace(tmp, side)

    ways = {
        "RocksDB batch only (before the hint)": without_hint,
        "RocksDB batch + hint pwrite (write() now)": lambda n: store.write(changes, n),
        "RocksDB batch + hint by temporary file and rename": renamed_hint,
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(5):  # interleaved, so drift on a shared machine hits all alike
        for name, way in ways.items():
            samples[name].append(per_call_us(lambda n, w=way, r=round_: w(r * 10**6 + n), 1000))
    store.close()
    base = statistics.median(samples["RocksDB batch only (before the hint)"])
    row("commit of 10 keys and a checkpoint", "us (median of 5 rounds)", "ratio")
    row("---", "---", "---")
    for name, times in samples.items():
        row(name, f"{statistics.median(times):.1f}", f"{statistics.median(times) / base:.2f}")


def scan_status_cost(work: Path) -> None:
    store = PartitionStore(work / "scans" / "0")
    store.write({b"k%06d" % n: b"v" * 50 for n in range(10_000)}, 1)

    def scan_before(lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:  # the scan before status()
        options = ReadOptions()
        options.set_iterate_upper_bound(hi)
        iterator = store._db.iter(options)
        iterator.seek(lo)
        while iterator.valid():
            yield iterator.key(), iterator.value()
            iterator.next()

    ways = {"scan before (no status())": scan_before, "PartitionStore.scan (status() at the end)": store.scan}
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(5):
        for name, scan in ways.items():
            one_key = lambda n, s=scan: list(s(b"k%06d" % (n % 9_999), b"k%06d" % (n % 9_999 + 1)))  # noqa: E731
            samples[name].append(per_call_us(one_key, 5000))
    store.close()
    base = statistics.median(samples["scan before (no status())"])
    row("one-key scan", "us (median of 5 rounds)", "ratio")
    row("---", "---", "---")
    for name, times in samples.items():
        row(name, f"{statistics.median(times):.2f}", f"{statistics.median(times) / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.dir))
    try:
        print(f"stores in {work}\n")
        checkpoint_reads(work)
        print()
        hint_cost(work)
        print()
        scan_status_cost(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
