"""What a worker serves about its joins, read-only: `/tandem/` (JSON) and `/tandem/html`
(view.py), the whole group's page (group_page.py), the recent past for its plots
(history.py), and Prometheus metrics at `/metrics` (metrics.py). The web layer reads the
runtime; the runtime knows nothing of it.
"""

from __future__ import annotations

from faust.types import AppT

from tables.runtime.worker import Runtime
from tables.web.group_page import register_group_views
from tables.web.metrics import register_metrics_page
from tables.web.view import register_views


def register_web(app: AppT, runtime: Runtime) -> None:
    """Every page of `runtime` on the app's web server (tables/api.py calls it once per app)."""
    register_metrics_page(app, runtime)
    register_views(app, runtime)
    register_group_views(app, runtime)
