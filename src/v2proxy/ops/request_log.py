"""v2proxy's log lines: one WARNING per failed request (logger ``v2proxy.requests``), with
``--access-log`` one INFO line per request (``v2proxy.access``), and the two formats every line
of the process is printed in (``--log-format text|json``)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

REQUEST_LOG = logging.getLogger("v2proxy.requests")
ACCESS_LOG = logging.getLogger("v2proxy.access")


def setup_logging(log_format: str, level: str, access_log: bool) -> None:
    """Print the process's log lines on stderr in ``log_format`` (text | json) from ``level``;
    with ``access_log`` the access lines whatever ``level`` says."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if access_log:
        ACCESS_LOG.setLevel(logging.INFO)


class RequestLog:
    """The log lines of one frontend's requests (``access_log``: ``--access-log``)."""

    __slots__ = ("access_log", "backend", "frontend")

    def __init__(self, frontend: str, backend: str, access_log: bool) -> None:
        self.frontend = frontend
        self.backend = backend
        self.access_log = access_log

    def write(
        self,
        failed: bool,
        request_id: str | None,
        model: str,
        method: str,
        path: str,
        status: int | str,
        duration: float,
        n_in: int,
        n_out: int,
        cause: str | None,
    ) -> None:
        """The request's log lines (call only when ``failed`` or ``self.access_log``)."""
        fields: dict[str, Any] = {
            "request_id": request_id or "-",
            "model": model,
            "frontend": self.frontend,
            "backend": self.backend,
            "method": method,
            "path": path,
            "status": status,
            "duration_s": round(duration, 6),
            "bytes_in": n_in,
            "bytes_out": n_out,
        }
        if failed:
            fields["cause"] = cause or f"status {status}"
            REQUEST_LOG.warning("request failed", extra={"request": fields})
        if self.access_log:
            fields.pop("cause", None)
            ACCESS_LOG.info("request", extra={"request": fields})


class TextFormatter(logging.Formatter):
    """``time LEVEL logger[pid]: message key=value ...`` (the record's ``request`` fields)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields: dict[str, Any] | None = getattr(record, "request", None)
        if fields:
            for k, v in fields.items():
                line += f" {k}={json.dumps(v) if isinstance(v, str) else v}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, pid, message, the ``request`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        obj.update(getattr(record, "request", None) or {})
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False, default=str)
