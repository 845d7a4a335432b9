"""Settings of the join runtime, with defaults and environment overrides.

| setting | environment variable | default |
| --- | --- | --- |
| align_max_wait_ms | TANDEM_ALIGN_MAX_WAIT_MS | 2000: how long an input of unknown end holds the other |
| align_max_held | TANDEM_ALIGN_MAX_HELD | 50000 records held per partition for event-time order, at most |
| batch_max_records | TANDEM_BATCH_MAX_RECORDS | 4000 input records joined per batch, at most |
| restore_stall_s | TANDEM_RESTORE_STALL_S | 120: a restore that makes no progress this long is retried |
| sync_writes | TANDEM_SYNC_WRITES | false: fsync every state write (also survives a machine crash) |
| data_dir | TANDEM_JOIN_DIR | `<Faust datadir>/tandem-joins` |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "TANDEM_"
_ENV_NAMES = {"data_dir": "TANDEM_JOIN_DIR"}


@dataclass(frozen=True)
class RuntimeSettings:
    align_max_wait_ms: int = 2000
    align_max_held: int = 50_000
    batch_max_records: int = 4_000
    restore_stall_s: float = 120.0
    sync_writes: bool = False
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        for name in ("align_max_wait_ms", "align_max_held", "batch_max_records", "restore_stall_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be positive, not {getattr(self, name)}")

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
    if name == "sync_writes":
        return raw.lower() in ("1", "true", "yes", "on")
    try:
        return float(raw) if name == "restore_stall_s" else int(raw)
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a number") from None
