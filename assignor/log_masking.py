"""Secrets kept out of every log line, DEBUG included.

At DEBUG, aiokafka logs each request and response it exchanges with a broker
(`aiokafka.conn`: "Request to host:port n: <struct>"), and a SaslAuthenticate request
carries the SASL bytes: with PLAIN, the password itself. `install()` puts a mask in front of
every log record of the process: a SaslAuthenticate request or response shows as
`SaslAuthenticateRequest_v1(sasl_auth_bytes=[redacted])`, every secret Tandem was given
(`remember`: the SASL password and the TLS key password of each client it builds) is
replaced by `[redacted]` wherever it shows, and so is the value of any `password=...`,
`secret: ...`, `token=...` or `sasl.jaas.config=...` written in a line.

The mask wraps the log record factory rather than sitting on a logger or a handler: a
logger's filter does not see its children's records, and Faust configures its handlers when
the worker starts, after the app (and Tandem) are imported. Only records that are emitted
pass through it (a disabled DEBUG line is never made).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

REDACTED = "[redacted]"
_SASL_STRUCT_PREFIX = "SaslAuthenticate"  # aiokafka's SaslAuthenticate{Request,Response}_vN
# `key=value` or `key: value` (quoted or not) where the key names a secret.
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)(\b[\w.]*(?:password|passwd|secret|token|jaas[\w.]*|credentials?)['\"]?\s*[=:]\s*)"
    r"(?:'[^']*'|\"[^\"]*\"|[^\s,;)}\]]+)"
)
_MIN_SECRET = 4  # shorter values would mask ordinary words; no real password is this short

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def remember(*secrets: str | None) -> None:
    """Mask these values (and their forms in a bytes repr) in every log line from now on."""
    with _lock:
        for secret in secrets:
            if secret and len(secret) >= _MIN_SECRET:
                _secrets.update(_forms(secret))


def remember_app(app: Any) -> None:
    """Mask the secrets of a Faust app's own broker connection (`broker_credentials`)."""
    credentials = app.conf.broker_credentials
    remember(getattr(credentials, "password", None))


def _forms(secret: str) -> set[str]:
    """The secret as text, and as it shows inside a repr of its UTF-8 bytes."""
    return {secret, repr(secret.encode())[2:-1], repr(secret)[1:-1]}


def mask(text: str) -> str:
    """`text` with every remembered secret and every secret assignment redacted."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)


class SecretMask(logging.Filter):
    """Rewrites a record so that no secret shows in it; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_is_sasl_struct(a) for a in args):
            record.args = tuple(_redacted_struct(a) if _is_sasl_struct(a) else a for a in args)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it; nothing to mask here
            return True
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def _is_sasl_struct(value: Any) -> bool:
    return type(value).__name__.startswith(_SASL_STRUCT_PREFIX)


def _redacted_struct(value: Any) -> str:
    return f"{type(value).__name__}(sasl_auth_bytes={REDACTED})"


def install() -> None:
    """Mask every log record of this process from now on (once; later calls do nothing)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    make_record: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()
    secret_mask = SecretMask()

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        secret_mask.filter(record)
        return record

    logging.setLogRecordFactory(masked_record)
