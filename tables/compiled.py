"""Optional compiled parts (Cython, built by setup.py): which one runs, and switching it.

Each compiled part has a pure-Python reference it must equal, and which runs where the part
is not built (an install without a C compiler, a source tree not built in place) or where
`TANDEM_PURE_PYTHON=1` (read once, at import). Tests and benchmarks switch a part off and
on in one process (`use`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class CompiledPart(Generic[T]):
    """One compiled extension module and what its user takes from it (`bind(module)`).

    `fast` is that, or None when the part is not built, forced off or switched off: a
    user reads it where it decides which code runs."""

    def __init__(self, module: str, bind: Callable[[ModuleType], T], what: str) -> None:
        self.module = module
        self.what = what  # what it is, for the worker's log: "the windowed join's per-record loop"
        self.built: ModuleType | None = _import(module)
        self._bind = bind
        self.bound: T | None = bind(self.built) if self.built is not None else None
        self.fast: T | None = self.bound
        PARTS.append(self)

    @property
    def active(self) -> bool:
        """Whether the compiled part runs (the worker logs it at start)."""
        return self.fast is not None

    def use(self, enabled: bool) -> None:
        """Switch the compiled part on or off. Raises RuntimeError to switch on a part
        that is not built (or TANDEM_PURE_PYTHON=1)."""
        if enabled and self.bound is None:
            raise RuntimeError(f"{self.module} is not built, or TANDEM_PURE_PYTHON=1")
        self.fast = self.bound if enabled else None


# Every compiled part made (at the import of its user): the worker logs which ones run.
PARTS: list[CompiledPart[Any]] = []


def _import(module: str) -> ModuleType | None:
    """The extension module, or None: not built, or TANDEM_PURE_PYTHON=1. Quiet: the
    runtime says which code runs when it starts."""
    if os.environ.get("TANDEM_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
