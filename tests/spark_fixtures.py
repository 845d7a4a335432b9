"""One SparkSession for the whole test session, shared by the tests/test_pipeline_*.py files.

Each file declares a `spark` fixture that returns `spark_session()`; the session is
built once (start-up costs 15-40 s on this machine) and stopped at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from assignor import clients
from pipeline.spark import session


@functools.cache
def spark_session() -> SparkSession:
    spark = session(
        "local[2]",
        "tandem-tests",
        shuffle_partitions=2,
        conf={"spark.sql.adaptive.enabled": "false"},
    )
    atexit.register(spark.stop)
    return spark


async def produce_values(
    connection: str | Mapping[str, Any],
    topic: str,
    records: Iterable[tuple[bytes | None, bytes]],
    batched: bool = True,
) -> None:
    """Produce (key, value) pairs in order; `batched` lets several records share a batch."""
    settings = clients.settings_of(connection)
    producer = clients.producer(settings, linger_ms=20 if batched else 0, acks=1)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        await asyncio.wait_for(asyncio.gather(*futures), timeout=30)
    finally:
        await producer.stop()
