"""Private defaults for the web server of every app Tandem is installed into.

Faust binds its web server to every interface (`web_bind` 0.0.0.0) and serves its own
endpoints beside Tandem's: `/table/` (the app's Faust tables: names, and each key's value
on request), `/router/` (which worker owns a key: the group's URLs). Tandem's pages are
read-only and unauthenticated, and table contents are data. So, unless the app says
otherwise, an app with Tandem:

- binds to 127.0.0.1 (`WEB_BIND` in the environment, `web_bind=` on the app, its config
  object, or `faust worker --web-bind` still decide: containers set 0.0.0.0);
- does not serve Faust's `/table/` endpoints (`web_tables_enabled=True`, or
  `APP_WEB_TABLES_ENABLED=true`, turns them back on). `/router/` stays on: it shows no more
  than the group page does, and Faust's `@table_route` relies on it across workers.

"The app says" means the keyword argument to `faust.App(...)`, the object given to
`app.config_from_object(...)`, or the setting's environment variable (with the app's
`env_prefix`; for `web_bind` also Faust's `FAUST_WEB_BIND` / `F_WEB_BIND`, which change
Faust's own default).
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from typing import Any

from faust import App
from faust.types import AppT
from yarl import URL

from assignor import internals
from assignor.faust_adapter.group_consumer import add_start_check

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_LOOPBACKS = (LOOPBACK, "localhost", "::1")
_FAUST_DEFAULT_BIND_ENV = ("FAUST_WEB_BIND", "F_WEB_BIND")

internals.require(__name__, App, "_default_options", "_config_source", instance=True)
internals.require(__name__, App, "_load_settings_from_source")


_applied: weakref.WeakSet[AppT] = weakref.WeakSet()


def apply(app: AppT) -> None:
    """Bind to the loopback and leave Faust's `/table/` off, where the app did not choose
    (once per app: Tandem calls it before it registers its first page)."""
    if app in _applied:
        return
    _applied.add(app)
    conf = app.conf
    if not set_by_app(app, "web_bind") and not any(os.environ.get(n) for n in _FAUST_DEFAULT_BIND_ENV):
        conf.web_bind = LOOPBACK
    if not set_by_app(app, "web_tables_enabled"):
        if type(app).web.is_set(app):  # type: ignore[attr-defined]  # Faust chose its endpoints when app.web was first made
            log.warning(
                "Faust's /table/ endpoints stay on: the app made its web server before Tandem was "
                "installed; set web_tables_enabled=False (or True) on the app to decide"
            )
        else:
            conf.web_tables_enabled = False
    add_start_check(app, functools.partial(warn_if_unreachable, app))


async def warn_if_unreachable(app: AppT) -> None:
    """Say so at start when the server listens on the loopback while the worker advertises
    another host: the other workers (the group page, the routing table) cannot reach it."""
    conf = app.conf
    if not conf.web_enabled or conf.web_bind not in _LOOPBACKS:
        return
    advertised = URL(str(conf.canonical_url)).host or ""
    if advertised not in _LOOPBACKS:
        log.warning(
            "the web server listens on %s only, but this worker advertises %s to the group: other "
            "workers cannot reach it; set WEB_BIND (or web_bind=) to an address they reach",
            conf.web_bind,
            conf.canonical_url,
        )


def set_by_app(app: AppT, name: str) -> bool:
    """Whether the app chose setting `name` (see the module's docstring), not Faust's default."""
    _, options = app._default_options  # faust.App(id, **options)
    if options.get(name) is not None:
        return True
    source = app._config_source  # type: ignore[attr-defined]  # app.config_from_object(source)
    if source is not None:
        loaded: Any = app._load_settings_from_source(source, silent=True)  # type: ignore[attr-defined]
        if loaded.get(name) is not None:
            return True
    env_name = app.conf.SETTINGS[name].env_name
    return env_name is not None and app.conf.getenv(env_name) is not None
