"""Log set-up of the ``shoal`` commands: plain text lines, or one JSON object per line.

``--log-format json`` (env ``SHOAL_LOG_FORMAT``) writes each record as one
JSON object with ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message`` and ``process``, then every field a call site passed with
``extra=`` (shoal's workers pass ``queue`` and ``job_id``), and ``exception``
with the formatted traceback when there is one:

>>> import logging
>>> record = logging.LogRecord("shoal.worker", logging.WARNING, __file__, 1,
...     "job %s failed", (7,), None)
>>> record.queue = "email"
>>> line = JsonFormatter().format(record)
>>> import json; fields = json.loads(line)
>>> fields["level"], fields["logger"], fields["message"], fields["queue"]
('WARNING', 'shoal.worker', 'job 7 failed', 'email')
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"

# What every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def _plain(value: Any) -> Any:
    """``value`` if JSON can hold it as it is, else its ``str``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in fields:
                fields[key] = _plain(value)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, ensure_ascii=False, default=str)


def configure(level: int | str, log_format: str = "text") -> None:
    """Set the root logger's level and its one stderr handler's format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


__all__ = ["LOG_FORMATS", "TEXT_FORMAT", "JsonFormatter", "configure"]
