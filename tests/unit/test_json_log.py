"""``--log-format json``: each line's ``ts`` is RFC 3339 with its time zone (UTC, ``Z``), the
instant of the record to the millisecond, whatever the machine's local time zone."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from v2proxy.ops.request_log import JsonFormatter


@pytest.fixture
def tokyo_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone 9 hours east of UTC (a zone-less ts would be off by 9 h)."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_ts_is_rfc3339_utc(tokyo_time: None) -> None:
    record = logging.LogRecord("v2proxy", logging.INFO, __file__, 1, "hello", None, None)
    record.created = 1795623139.123456  # 2026-11-25T16:12:19.123456Z
    record.msecs = 123.456
    obj = json.loads(JsonFormatter().format(record))
    assert obj["ts"] == "2026-11-25T16:12:19.123Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", obj["ts"])
    parsed = datetime.fromisoformat(obj["ts"])
    assert parsed.tzinfo is not None
    assert parsed == datetime(2026, 11, 25, 16, 12, 19, 123000, tzinfo=UTC)
    assert obj["message"] == "hello" and obj["level"] == "INFO"
