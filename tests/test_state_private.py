"""A worker's state is private to its user (issue 36, finding 7): its data dirs 0700 and its
files 0600, RocksDB's own included, whatever umask it was started with (TANDEM_UMASK, 077 by
default; `inherit` keeps the one it was started with). The state holds input values in plain
text (the WAL, the tables)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tables.settings import RuntimeSettings
from tables.state.datadir import make_private
from tables.testing import EmbeddedBroker
from tests.workers import cluster


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask (a worker started here inherits it), then the one before."""
    was = os.umask(mask)
    try:
        yield
    finally:
        os.umask(was)


def open_to_others(root: Path) -> list[str]:
    """Each directory and file under `root` (itself included) that group or others may use."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077 and not path.is_symlink():
            found.append(f"{path.relative_to(root.parent)} {mode:04o}")
    return found


async def _send_pair(bootstrap: str, impressions: str, clicks: str, run: str) -> None:
    now = int(time.time() * 1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        imp = {"event_id": "i1", "auction_id": run, "campaign_id": "c", "ts": now}
        await producer.send_and_wait(impressions, json.dumps(imp).encode(), key=run.encode())
        click = {"event_id": "c1", "auction_id": run, "ts": now + 10}
        await producer.send_and_wait(clicks, json.dumps(click).encode(), key=run.encode())
    finally:
        await producer.stop()


@pytest.mark.broker
@pytest.mark.timeout(240)
def test_a_workers_data_dirs_and_files_are_private_to_its_user(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        with umask(0o022):  # the usual umask, which made them 0755 and 0644
            worker = c.worker("w1", "host-a").start()
        c.wait_covered(90)
        s = c.settings
        asyncio.run(_send_pair(broker.bootstrap, s.impressions, s.clicks, unique))
        assert "i1|c1" in c.joins({"i1|c1"}, timeout=60)
        data_dir = Path(worker.data_dir)
        rocksdb = [
            p
            for p in data_dir.rglob("*")
            if p.name.startswith(("MANIFEST-", "OPTIONS-")) or p.suffix == ".log"
        ]
        assert rocksdb, f"no RocksDB files under {data_dir}"
        assert open_to_others(data_dir) == []
        worker.check()


def test_umask_is_a_setting_and_inherit_leaves_the_process_one() -> None:
    assert RuntimeSettings.from_env({}).umask == 0o077
    assert RuntimeSettings.from_env({"TANDEM_UMASK": "027"}).umask == 0o027
    assert RuntimeSettings.from_env({"TANDEM_UMASK": "inherit"}).umask is None
    for bad in ("rw", "1000", "9"):
        with pytest.raises(ValueError, match="TANDEM_UMASK"):
            RuntimeSettings.from_env({"TANDEM_UMASK": bad})


def test_a_data_dir_written_before_is_closed_and_inherit_leaves_it(tmp_path: Path) -> None:
    old = tmp_path / "tandem-joins"
    (old / "ad-join" / "0").mkdir(parents=True)
    old.chmod(0o755)
    make_private(None, old)
    assert stat.S_IMODE(old.stat().st_mode) == 0o755
    make_private(0o077, old, tmp_path / "missing")
    assert stat.S_IMODE(old.stat().st_mode) == 0o700
