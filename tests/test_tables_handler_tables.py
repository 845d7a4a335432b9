"""A Faust table updated in a join's handler (the reference app's click-throughs): its
changelog is produced with the batch's output (collect_handler_sends), and
must be what Faust's own sends would have made of it. One real worker on the embedded
broker, its changelog read back, its table's RocksDB files read after it stopped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from tables.testing import EmbeddedBroker, read_records
from tests.workers import PARTITIONS, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(150)]

FAUST_OFFSET_KEY = b"__faust\0offset__"  # where Faust keeps a table partition's persisted offset


def test_handler_table_changelog_complete_on_its_partitions_and_persisted(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        worker = c.worker("w1", "host-a", standby_replicas=0).start()
        c.wait_covered()
        traffic = c.send(c.traffic(f"{unique}-t"), 400, rate=400.0)
        outputs = c.read(c.settings.joins, lambda rs: traffic.expected <= {r["join_id"] for r in rs}, 60)
        assert traffic.expected <= {r["join_id"] for r in outputs}
        served = worker.get("/ad/click-throughs")
        assert served is not None and sum(served.values()) == len(outputs), (served, len(outputs))
        view = worker.join()
        assert view is not None
        worker.stop(15)

        changelog = f"{c.settings.app_id}-click-throughs-changelog"
        records = asyncio.run(read_records(broker.bootstrap, changelog, PARTITIONS))
        last: dict[str, int] = {}
        last_offset: dict[int, int] = {}
        for record in records:
            key = json.loads(record.key)  # Faust's JSON key, as its own send serializes it
            assert key.endswith(f"@{record.partition}"), (key, record.partition)  # the join's partition
            last[key] = json.loads(record.value)
            last_offset[record.partition] = record.offset
        # All of them went with the join's output (none through Faust's producer buffer).
        assert view["faust_sends"] == len(records) > 0
        # Every click joined counted once, per campaign, as the worker served it.
        per_campaign: dict[str, int] = {}
        for key, n in last.items():
            campaign = key.rsplit("@", 1)[0]
            per_campaign[campaign] = per_campaign.get(campaign, 0) + n
        assert per_campaign == served

        # Each table partition's files hold the offset of its last changelog record (the
        # callback Faust runs on each ack: a restart reads the changelog from there on).
        stores = sorted(tmp_path.glob("**/click-throughs-*.db"))
        assert stores, f"no table store under {tmp_path}"
        persisted: dict[int, int] = {}
        for path in stores:
            partition = int(path.name.removesuffix(".db").rsplit("-", 1)[1])
            db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
            try:
                found = db.get(FAUST_OFFSET_KEY)
            finally:
                db.close()
            if found is not None:
                persisted[partition] = int(found)
        assert persisted == last_offset
