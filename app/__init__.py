"""The reference ad join app: `faust -A app worker` (run from the repository's root).

`app.app` is the Faust App, built from the environment (app/settings.py) on first
access: Faust's `-A app` reads that attribute, while importing a submodule
(`app.traffic`, `app.demo`) builds nothing.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from app.join import build
        from app.settings import from_env

        built = build(from_env())
        globals()["app"] = built  # once per process
        return built
    raise AttributeError(f"module 'app' has no attribute {name!r}")
