"""The user's app, as the batch side sees it: its declared joins, found by importing the app's
module the way `faust -A MODULE` does, without starting a worker.

Everything the twin needs comes from the declaration (`tables.JoinSpec`): the input topics,
their key and value types and serializers (through the stream's own checks,
`JoinSpec.codecs`: tables/records/sides.py), the kind with its window and `how`, `timestamp`, `id`,
`validate`, `partitioner` and `max_value_bytes`.

Spark's Python workers cannot be handed a declaration (a Faust app, user functions): they are
handed a `JoinRef` (module and join name) and import the module once per worker process.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from faust.types import AppT

from assignor.clients import bootstrap_of, faust_client_kwargs
from tables.api import runtime_of
from tables.operators.base import Side
from tables.records.codecs import SideCodec
from tables.spec import JoinSpec


class AppNotFound(LookupError):
    """The module declares no join, or not the one asked for; the message lists what it has."""


def _apps_in(module: Any, attribute: str | None) -> list[AppT]:
    if attribute is not None:
        return [getattr(module, attribute)]
    found = [value for value in vars(module).values() if isinstance(value, AppT)]
    if not found and isinstance(getattr(module, "app", None), AppT):  # built on first access
        found = [module.app]
    return found


def import_app_module(app: str) -> Any:
    """Import `MODULE` (or `MODULE:ATTRIBUTE`), from the current directory too, as `faust -A`."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(app.partition(":")[0])


def declared_joins(app: str) -> list[JoinSpec]:
    """Every join the app's module declares, in declaration order: the joins of its Faust
    apps (`tables.runtime_of(app).specs()`) and any `JoinSpec` it holds."""
    module_name, _, attribute = app.partition(":")
    module = import_app_module(app)
    found: dict[tuple[int, str], JoinSpec] = {}
    for faust_app in _apps_in(module, attribute or None):
        for spec in runtime_of(faust_app).specs():
            found.setdefault((id(spec.app), spec.name), spec)
    for value in vars(module).values():
        if isinstance(value, JoinSpec):
            found.setdefault((id(value.app), value.name), value)
    return list(found.values())


def find_join(app: str, join: str | None = None) -> JoinSpec:
    """The join named `join` of the app's module, or its only join."""
    specs = declared_joins(app)
    names = [spec.name for spec in specs]
    if not specs:
        raise AppNotFound(f"{app} declares no join (tables.join)")
    if join is None:
        if len(specs) > 1:
            raise AppNotFound(f"{app} declares {len(specs)} joins: name one with --join ({', '.join(names)})")
        return specs[0]
    for spec in specs:
        if spec.name == join:
            return spec
    raise AppNotFound(f"{app} declares no join {join!r}; its joins: {', '.join(names)}")


def app_bootstrap(spec: JoinSpec) -> str:
    """The bootstrap servers the app's own broker setting names (host:port,...)."""
    return bootstrap_of(faust_client_kwargs(spec.app.conf))


@dataclass(frozen=True)
class JoinRef:
    """A declared join by name, picklable: what Spark's Python workers are handed."""

    app: str  # MODULE or MODULE:ATTRIBUTE
    join: str

    @classmethod
    def of(cls, app: str, join: str | None = None) -> JoinRef:
        return cls(app, find_join(app, join).name)

    def spec(self) -> JoinSpec:
        """The declaration (the module imported once per process)."""
        return _spec(self.app, self.join)

    def codecs(self) -> dict[Side, SideCodec]:
        """The stream's own per-record checks of both inputs, by side (made once per process)."""
        return _codecs(self.app, self.join)


@functools.cache
def _spec(app: str, join: str) -> JoinSpec:
    return find_join(app, join)


@functools.cache
def _codecs(app: str, join: str) -> dict[Side, SideCodec]:
    spec = _spec(app, join)
    return spec.codecs()


def describe(spec: JoinSpec) -> dict[str, Any]:
    """What the twin read of a declaration, for its summary."""
    return {
        "join": spec.name,
        "topics": {"left": spec.left.name, "right": spec.right.name},
        **spec.kind.describe(),
        "timestamp": {s: _named(getattr(spec, s).timestamp) for s in ("left", "right")},
        "id": {s: _named(getattr(spec, s).id) for s in ("left", "right")},
        # A rekeyed input: read from its source topic, rekeyed by `key` (pipeline/rekey.py).
        "rekeyed": {
            r.side: {"source": r.source.name, "key": _named(r.source.key)} for r in spec.repartitions
        },
        "partitioner": spec.partitioner,
        "max_value_bytes": spec.max_value_bytes,
        "audit": spec.audit,
    }


def _named(option: Any) -> Any:
    return getattr(option, "__qualname__", option)


def names(specs: Iterable[JoinSpec]) -> list[str]:
    return [spec.name for spec in specs]
