"""The reference ad join app: `faust -A app worker`.

`app.app` is the Faust App, built from the environment (app/settings.py) on
first access: Faust's `-A app` reads that attribute, while importing a
submodule (`app.broker`, the embedded broker launcher) builds nothing.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from app.settings import from_env
        from app.worker import build

        built = build(from_env())
        globals()["app"] = built  # once per process
        return built
    raise AttributeError(f"module 'app' has no attribute {name!r}")
