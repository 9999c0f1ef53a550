"""Logging for `ptctl serve`: uvicorn's and ours, with every configured secret redacted.

Uvicorn's access log shows the request line, never headers, so the `Authorization` header is not
logged; `RedactSecrets` is the second line of defence: any log record whose text contains a token of
`PTCTL_API_TOKENS` (a token pasted into a URL, an exception message) is rewritten with `***`.
"""

from __future__ import annotations

import logging
from typing import Any

from service.settings import Settings


class RedactSecrets(logging.Filter):
    def __init__(self, secrets: list[str] | None = None) -> None:
        super().__init__()
        self.secrets = [s for s in (Settings().secrets() if secrets is None else secrets) if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
                record.exc_info, record.exc_text = None, None
            if any(s in text for s in self.secrets):
                for secret in self.secrets:
                    text = text.replace(secret, "***")
            record.msg, record.args = text, ()
        return True


def log_config(level: str = "INFO") -> dict[str, Any]:
    """A `logging.config.dictConfig` for uvicorn: one stderr handler, timestamps, the redaction filter."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain",
               "filters": ["redact"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": "service.logs.RedactSecrets"}},
        "formatters": {"plain": {"format": fmt}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {**{name: {"handlers": [], "level": level, "propagate": True}
                       for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
                    **{name: {"level": "WARNING"} for name in ("alembic", "httpx")}},  # per-request chatter
    }
