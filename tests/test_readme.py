"""The README's "Write your own join", done as a newcomer would, in a directory of its own
outside this repository: the app as written, its unit test through the test driver (run by
pytest), two local workers through the runner (`python -m tables.dev`), and a worker as
`faust -A paid worker` on a broker of its own."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from assignor import clients
from tables.testing import EmbeddedBroker, WorkerProcess, embedded_env, wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
README = Path(__file__).resolve().parent.parent / "README.md"


def readme_blocks() -> list[str]:
    section = README.read_text().split("## Write your own join", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def newcomer_dir(tmp_path: Path, unique: str) -> Path:
    """paid.py and test_paid.py as the README gives them (a fresh app id per run)."""
    app, test = readme_blocks()[:2]  # the blocks after them extend paid.py (tested on their own)
    (tmp_path / "paid.py").write_text(app.replace('faust.App("paid"', f'faust.App("paid-{unique}"'))
    (tmp_path / "test_paid.py").write_text(test)
    return tmp_path


def newcomer_env() -> dict[str, str]:
    """This environment, without this repository on the path: only the installed package."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_readme_unit_test_passes_through_the_test_driver(unique: str, tmp_path: Path) -> None:
    where = newcomer_dir(tmp_path, unique)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_paid.py"],
        cwd=where, env=newcomer_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


def test_the_readme_join_runs_on_two_local_workers(unique: str, tmp_path: Path) -> None:
    where = newcomer_dir(tmp_path, unique)
    runner = subprocess.Popen(
        [sys.executable, "-m", "tables.dev", "paid", "--workers", "2", "--standbys", "1",
         "--run-dir", str(tmp_path / "run")],
        cwd=where, env=newcomer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert runner.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not any(line.startswith("Ctrl-C") for line in lines) and time.monotonic() < deadline:
            line = runner.stdout.readline()
            if not line and runner.poll() is not None:
                break
            lines.append(line)
        output = "".join(lines)
        assert "ready: every partition owned and restored" in output, output
        bootstrap = re.search(r"broker: (\S+)", output).group(1)  # type: ignore[union-attr]
        assert len(re.findall(r"worker-\d: http://127\.0\.0\.1:\d+/tandem/html", output)) == 2, output
        asyncio.run(_send(bootstrap))
        found = asyncio.run(_read(bootstrap, "paid-orders", lambda rs: len(rs) >= 1, 60))
        assert found == [{"result_id": "7:p7", "order_id": 7, "paid": True}]
    finally:
        runner.send_signal(signal.SIGINT)
        code = runner.wait(timeout=60)
    assert code == 0, "".join(lines)


def test_the_readme_join_runs_as_a_faust_worker(unique: str, tmp_path: Path) -> None:
    with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:  # its own: the README's topic names
        where = newcomer_dir(tmp_path, unique)
        worker = WorkerProcess("w1", "paid", tmp_path, embedded_env(), cwd=where)
        # Faust's settings in the environment win over the app's (the README, step 5).
        worker.extra_env.update({"BROKER_URL": f"kafka://{broker.bootstrap}", "WEB_PORT": str(worker.port)})
        worker.start()
        try:
            joined = lambda: (worker.view() or {}).get("joins", {}).get("paid", {}).get("actives")  # noqa: E731
            assert wait_for(joined, 60), worker.log_path.read_text()[-3000:]
            asyncio.run(_send(broker.bootstrap))
            found = asyncio.run(_read(broker.bootstrap, "paid-orders", lambda rs: len(rs) >= 1, 30))
            assert found == [{"result_id": "7:p7", "order_id": 7, "paid": True}]
        finally:
            worker.stop(15)


async def _send(bootstrap: str) -> None:
    producer: AIOKafkaProducer = clients.producer(clients.settings_of(bootstrap))
    await producer.start()
    try:
        order = {"order_id": 7, "customer": "c1", "amount_cents": 1250}
        payment = {"payment_id": "p7", "order_id": 7, "amount_cents": 1250}
        await producer.send_and_wait("orders", json.dumps(order).encode(), key=b"7")
        await producer.send_and_wait("payments", json.dumps(payment).encode(), key=b"7")
    finally:
        await producer.stop()
