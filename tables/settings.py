"""Settings of the join runtime, with defaults and environment overrides.

| setting | environment variable | default |
| --- | --- | --- |
| align_max_wait_ms | TANDEM_ALIGN_MAX_WAIT_MS | 2000: how long an input of unknown end holds the other |
| align_max_held | TANDEM_ALIGN_MAX_HELD | 50000 records held per partition for event-time order, at most |
| batch_max_records | TANDEM_BATCH_MAX_RECORDS | 10000 input records joined per batch, at most |
| restore_stall_s | TANDEM_RESTORE_STALL_S | 120: a stalled restore is retried, one failing this long stops |
| sync_writes | TANDEM_SYNC_WRITES | false: fsync every state write (also survives a machine crash) |
| create_topics | TANDEM_CREATE_TOPICS | true: create missing topics; false: check topics made by others |
| data_dir | TANDEM_JOIN_DIR | `<Faust datadir>/tandem-joins` |
| send_batch_bytes | TANDEM_SEND_BATCH_BYTES | 524288 bytes per record batch the join sends, at most |
| gc_threshold | TANDEM_GC_THRESHOLD | 50000: first-generation garbage collection threshold, at least |
| gc_batch_threshold | TANDEM_GC_BATCH_THRESHOLD | 1000000: the same while a batch runs (0: no change) |
| umask | TANDEM_UMASK | 077: state private to its user (dirs 0700, files 0600); `inherit`: as started |

A worker holds hundreds of thousands of long-lived objects on a backlog (fetched records,
held records, Faust's own): at Python's default threshold (700 allocations) every full
collection walks them all, a fifth of the worker's CPU (docs/bench/worker.md). The
worker raises the threshold when it starts (never lowers one the app set higher);
0 leaves Python's settings alone. While a batch runs, the collection is deferred to its end,
when the batch's own objects are freed (tables/runtime/gcpacing.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
ENV_PREFIX = "TANDEM_"
_ENV_NAMES = {"data_dir": "TANDEM_JOIN_DIR"}
# Record batches of the join's own sends (results, dead letters, changelog): the producer's own
# are `producer_max_batch_size` (16 KB by default), made for records trickling in under
# linger_ms; the join hands over thousands at once, and 16 KB batches meant ~40 produce requests
# per partition and batch, one after the other (docs/bench/worker.md). Within Kafka's default
# 1 MB per batch (message.max.bytes).
SEND_BATCH_BYTES = 512 * 1024


@dataclass(frozen=True)
class RuntimeSettings:
    align_max_wait_ms: int = 2000
    align_max_held: int = 50_000
    batch_max_records: int = 10_000  # 4,000: ~10 % more CPU per record (docs/bench/worker.md)
    restore_stall_s: float = 120.0
    sync_writes: bool = False
    create_topics: bool = True  # false: topics are created by someone else (ACLs); checked at start
    data_dir: Path | None = None
    gc_threshold: int = 50_000
    gc_batch_threshold: int = 1_000_000  # 0 (collect mid-batch): ~10 % more CPU per record
    send_batch_bytes: int = SEND_BATCH_BYTES  # 16 KB (the producer's own): ~15 % more CPU per record
    # The worker process's umask from its start (its state holds input values in plain text);
    # None: the umask it was started with (tables/state/datadir.py `make_private`).
    umask: int | None = 0o077

    def __post_init__(self) -> None:
        if self.umask is not None and not 0 <= self.umask <= 0o777:
            raise ValueError(f"{ENV_PREFIX}UMASK must be octal 000 to 777, or inherit, not {self.umask:o}")
        for name in ("gc_threshold", "gc_batch_threshold"):
            if (value := getattr(self, name)) < 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must not be negative, not {value}")
        for name in (
            "align_max_wait_ms",
            "align_max_held",
            "batch_max_records",
            "restore_stall_s",
            "send_batch_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be positive, not {getattr(self, name)}")
        if self.align_max_held < 4 * self.batch_max_records:
            log.warning(
                "%sALIGN_MAX_HELD=%s is below four batches (%sBATCH_MAX_RECORDS=%s): a backlog may "
                "fill it and force records out of event-time order (docs/operations.md)",
                ENV_PREFIX, self.align_max_held, ENV_PREFIX, self.batch_max_records,
            )  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RuntimeSettings:
        """Defaults, then `TANDEM_*` variables, then `overrides`."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(_ENV_NAMES.get(f.name, ENV_PREFIX + f.name.upper()), "").strip()
            if raw:
                values[f.name] = _parse(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, raw: str) -> Any:
    if name == "data_dir":
        return Path(raw)
    if name == "umask":
        if raw.lower() == "inherit":
            return None
        try:
            return int(raw.removeprefix("0o"), 8)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}UMASK={raw!r}: use octal (077, 027) or inherit") from None
    if name in ("sync_writes", "create_topics"):
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r}: use true or false")
        return raw.lower() in ("1", "true", "yes", "on")
    try:
        return float(raw) if name == "restore_stall_s" else int(raw)
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a number") from None
