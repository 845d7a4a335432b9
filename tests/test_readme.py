"""The README's "Write your own join", done as a newcomer would: its code in a file of its
own, outside this repository, run with `faust -A paid worker` on the embedded broker."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tables.testing import EmbeddedBroker, WorkerProcess, embedded_env, wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]
README = Path(__file__).resolve().parent.parent / "README.md"


def readme_join() -> str:
    section = README.read_text().split("## Write your own join", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_readme_join_runs_as_written(unique: str, tmp_path: Path) -> None:
    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:  # its own: the README's topic names
        _run(broker, unique, tmp_path)


def _run(broker: EmbeddedBroker, unique: str, tmp_path: Path) -> None:
    source = readme_join().replace("kafka://localhost:9092", f"kafka://{broker.bootstrap}")
    source = source.replace('faust.App("paid"', f'faust.App("paid-{unique}"')
    (tmp_path / "paid.py").write_text(source)
    worker = WorkerProcess("w1", "paid", tmp_path, embedded_env(), cwd=tmp_path)
    worker.extra_env["WEB_PORT"] = str(worker.port)  # Faust reads its own settings from there
    worker.start()
    try:
        assert wait_for(lambda: (worker.view() or {}).get("joins", {}).get("paid", {}).get("actives"), 60), (
            worker.log_path.read_text()[-3000:]
        )
        asyncio.run(_send(broker.bootstrap))
        found = asyncio.run(_read(broker.bootstrap, "paid-orders", lambda rs: len(rs) >= 1, 30))
        assert found == [{"order_id": 7, "paid": True}]
    finally:
        worker.stop(15)


async def _send(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        order = {"order_id": 7, "customer": "c1", "amount_cents": 1250}
        payment = {"payment_id": "p7", "order_id": 7, "amount_cents": 1250}
        await producer.send_and_wait("orders", json.dumps(order).encode(), key=b"7")
        await producer.send_and_wait("payments", json.dumps(payment).encode(), key=b"7")
    finally:
        await producer.stop()
