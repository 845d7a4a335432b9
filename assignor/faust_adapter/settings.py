"""Settings of the Tandem assignor, with defaults and environment overrides.

| setting | environment variable | default |
| --- | --- | --- |
| standby_replicas | TANDEM_STANDBY_REPLICAS | the app's ``table_standby_replicas`` (Faust: 1) |
| host | TANDEM_HOST | this machine's host name |
| rack | TANDEM_RACK | none |
| capacity | TANDEM_CAPACITY | 1.0 |
| acceptable_recovery_lag | TANDEM_ACCEPTABLE_RECOVERY_LAG | 10000 records (Kafka Streams') |
| warmups | TANDEM_WARMUPS | true: moves wait for a warm-up replica to catch up (KIP-441) |
| max_warmup_replicas | TANDEM_MAX_WARMUP_REPLICAS | 2 (Kafka Streams') |
| probing_rebalance_interval_s | TANDEM_PROBING_REBALANCE_INTERVAL_S | 600 (Kafka Streams' 10 min) |
| end_offsets_timeout_ms | TANDEM_END_OFFSETS_TIMEOUT_MS | 2000: the leader's changelog end-offset lookup |
| fetch_max_wait_ms | TANDEM_FETCH_MAX_WAIT_MS | 1500 (Faust's); the embedded broker needs ~100 |
| follower_sync_delay_ms | TANDEM_FOLLOWER_SYNC_DELAY_MS | 0; the embedded broker needs ~150 |
| fetch_high_watermarks | TANDEM_FETCH_HIGH_WATERMARKS | false; true on the embedded broker |
| rebalance_protocol | TANDEM_REBALANCE_PROTOCOL | cooperative: KIP-429 rounds (docs/operations.md); eager |

Explicit arguments to :meth:`TandemSettings.from_env` win over the environment,
which wins over the defaults.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "TANDEM_"
DEFAULT_RECOVERY_LAG = 10_000
DEFAULT_MAX_WARMUPS = 2
DEFAULT_PROBING_INTERVAL_S = 600.0
REBALANCE_PROTOCOLS = ("eager", "cooperative")


class SettingsError(ValueError):
    """A Tandem setting has a value that cannot be used."""


@dataclass(frozen=True)
class TandemSettings:
    standby_replicas: int = 1
    host: str = ""
    rack: str = ""
    capacity: float = 1.0
    # A member is caught up on a task when its changelog offset is at most this many
    # records behind the changelog's end (without warm-ups: behind the freshest copy).
    acceptable_recovery_lag: int = DEFAULT_RECOVERY_LAG
    # Warm-ups (KIP-441): a task moves to a member that is not caught up only once a
    # warm-up replica there has caught up; the member then asks for a rebalance at once,
    # and the leader asks for one every probing interval while moves are pending.
    warmups: bool = True
    max_warmup_replicas: int = DEFAULT_MAX_WARMUPS
    probing_rebalance_interval_s: float = DEFAULT_PROBING_INTERVAL_S
    end_offsets_timeout_ms: int = 2000
    # Consumer timings Faust does not expose (docs/embedded-broker.md).
    fetch_max_wait_ms: int = 1500
    follower_sync_delay_ms: int = 0
    fetch_high_watermarks: bool = False
    # eager: every member gives up everything at each rebalance (aiokafka's and Faust's way);
    # cooperative: members keep what stays theirs, a moving task is revoked, then assigned in
    # a follow-up rebalance (KIP-429; docs/planner.md sections 8-9).
    rebalance_protocol: str = "cooperative"

    def __post_init__(self) -> None:
        if self.rebalance_protocol not in REBALANCE_PROTOCOLS:
            raise SettingsError(
                f"{ENV_PREFIX}REBALANCE_PROTOCOL must be 'eager' or 'cooperative', "
                f"not {self.rebalance_protocol!r}"
            )
        if self.standby_replicas < 0:
            raise SettingsError(f"standby_replicas must be >= 0, not {self.standby_replicas}")
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise SettingsError(f"capacity must be a positive number, not {self.capacity}")
        if self.acceptable_recovery_lag < 0:
            raise SettingsError(f"acceptable_recovery_lag must be >= 0, not {self.acceptable_recovery_lag}")
        if self.max_warmup_replicas < 0:
            raise SettingsError(f"max_warmup_replicas must be >= 0, not {self.max_warmup_replicas}")
        if not self.probing_rebalance_interval_s > 0:
            raise SettingsError(
                f"probing_rebalance_interval_s must be > 0, not {self.probing_rebalance_interval_s}"
            )
        if self.end_offsets_timeout_ms < 0:
            raise SettingsError(f"end_offsets_timeout_ms must be >= 0, not {self.end_offsets_timeout_ms}")
        if self.fetch_max_wait_ms < 0 or self.follower_sync_delay_ms < 0:
            raise SettingsError("fetch_max_wait_ms and follower_sync_delay_ms must be >= 0")
        if not self.host:
            object.__setattr__(self, "host", socket.gethostname())

    @property
    def cooperative(self) -> bool:
        return self.rebalance_protocol == "cooperative"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> TandemSettings:
        """``defaults``, then ``TANDEM_*`` variables, then ``overrides`` (None means unset)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {k: v for k, v in (defaults or {}).items() if v is not None}
        for field in fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is not None and raw.strip() != "":
                values[field.name] = _parse(field.name, raw.strip())
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, raw: str) -> Any:
    converters: dict[str, Callable[[str], Any]] = {
        "standby_replicas": int,
        "acceptable_recovery_lag": int,
        "capacity": float,
        "fetch_max_wait_ms": int,
        "follower_sync_delay_ms": int,
        "fetch_high_watermarks": _flag,
        "warmups": _flag,
        "max_warmup_replicas": int,
        "probing_rebalance_interval_s": float,
        "end_offsets_timeout_ms": int,
        "rebalance_protocol": str.lower,
    }
    convert = converters.get(name, str)
    try:
        return convert(raw)
    except ValueError as exc:
        raise SettingsError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {exc}") from exc


def _flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")
