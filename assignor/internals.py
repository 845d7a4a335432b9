"""The private Faust and aiokafka names Tandem relies on, and the check that they are there.

Tandem needs a few things neither library exposes. Each module that reads, overrides or
patches a private name declares it here (`require`), next to the code that uses it, and
any deeper check it needs (`require_probe`: e.g. that a record batch it fills is byte for
byte what the public call builds). `check()` runs when Tandem is installed into an app and
when a worker starts, and refuses to start, naming every problem, if the installed versions
differ from `PINNED` (pyproject.toml pins the same) or a name is gone.

A name is found either on its owner (a class or module attribute: `hasattr`), or, for an
instance attribute that the owner's `__init__` sets (`instance=True`), among the names the
owner's own code assigns or reads (its functions' code objects), which is what a rename in
a new release changes.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

from faust.exceptions import ImproperlyConfigured

PINNED = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


class IncompatibleInternals(ImproperlyConfigured):
    """The installed Faust or aiokafka lacks an internal Tandem relies on."""


@dataclass(frozen=True)
class Internal:
    """One private name: `owner.name`, read or patched by `user` (a Tandem module)."""

    owner: Any
    name: str
    user: str
    instance: bool = False  # an instance attribute set by the owner's code, not on the class

    @property
    def label(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", self.owner)
        return f"{owner}.{self.name}"

    def present(self) -> bool:
        if hasattr(self.owner, self.name):
            return True
        return self.instance and self.name in _names_in_code(self.owner)


_REQUIRED: list[Internal] = []
_PROBES: list[tuple[str, Callable[[], list[str]]]] = []


def require(user: str, owner: Any, *names: str, instance: bool = False) -> None:
    """Declare that module `user` reads or patches `owner.<name>` for each name."""
    for name in names:
        internal = Internal(owner, name, user, instance)
        if internal not in _REQUIRED:
            _REQUIRED.append(internal)


def require_probe(user: str, probe: Callable[[], list[str]]) -> None:
    """Declare a deeper check of module `user`: `probe()` lists what is wrong (empty: fine)."""
    if all(p is not probe for _, p in _PROBES):
        _PROBES.append((user, probe))


def required() -> list[Internal]:
    """Every private name declared so far (tests list them)."""
    return list(_REQUIRED)


def problems() -> list[str]:
    """What is wrong with the installed Faust and aiokafka, for Tandem (empty: nothing)."""
    found = []
    for package, wanted in PINNED.items():
        version = importlib.metadata.version(package)
        if version != wanted:
            found.append(f"{package} {version} is installed, Tandem's patches are written for {wanted}")
    for internal in _REQUIRED:
        if not internal.present():
            found.append(f"{internal.label} is missing (used by {internal.user})")
    for user, probe in _PROBES:
        found += [f"{problem} (used by {user})" for problem in probe()]
    return found


def check() -> None:
    """Refuse to run on Faust/aiokafka versions whose internals Tandem was not written for."""
    found = problems()
    if found:
        raise IncompatibleInternals(
            "Tandem cannot start: " + "; ".join(found) + f". Install {PINNED} (see pyproject.toml)."
        )


def _names_in_code(owner: Any) -> set[str]:
    """Attribute names the code of `owner` (a class and its bases, or a module) uses."""
    classes = inspect.getmro(owner) if inspect.isclass(owner) else (owner,)
    names: set[str] = set()
    for cls in classes:
        for value in vars(cls).values():
            function = getattr(value, "__func__", value)
            code = getattr(function, "__code__", None)
            if isinstance(code, CodeType):
                for nested in _code_objects(code):
                    names.update(nested.co_names)
    return names


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_objects(const)
