"""What every join kind's operator keeps in its state besides its records: metadata and the
counters of records it dropped (late, duplicates, ...), each under `keys.meta_key(name)`,
written to the changelog with the rest (the operator's `take_changes` sends the names marked
dirty). The join kinds share this code by inheriting `StateMeta`."""

from __future__ import annotations

from tables.operators import keys
from tables.operators.kv import KV


class StateMeta:
    """An operator's metadata and counters in its state. The operator sets `state` and
    `_dirty_meta`, and holds each counter as an int attribute of the counter's name."""

    state: KV
    _dirty_meta: set[str]

    def _meta(self, name: str) -> int | None:
        """A metadata value as the state holds it (None: never written)."""
        raw = self.state.get(keys.meta_key(name))
        return None if raw is None else keys.decode_int(raw)

    def _count(self, name: str, by: int = 1) -> None:
        """One more (`by` more) of counter `name`, in the state and marked for the changelog."""
        value = getattr(self, name) + by
        setattr(self, name, value)
        self.state.put(keys.meta_key(name), keys.encode_int(value))
        self._dirty_meta.add(name)
