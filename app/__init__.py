"""The reference ad join app: `faust -A app worker`.

Importing `app` builds the Faust App from the environment (app/settings.py)
and opens no connection; `app.broker` (the embedded broker launcher) imports
without further side effects.
"""

from __future__ import annotations

from app.settings import from_env
from app.worker import build

app = build(from_env())

__all__ = ["app"]
