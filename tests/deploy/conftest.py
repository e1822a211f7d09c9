"""tests/deploy's session hooks: test_checkov's one checkov run (test_checkov.Scan) starts as
soon as collection is done, where any of its tests was collected, so that it runs beside the
tests before it; it is stopped, if still running, when the session ends."""

from __future__ import annotations

import sys

import pytest

CHECKOV_MODULE = "tests.deploy.test_checkov"


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(
        item.module.__name__ == CHECKOV_MODULE
        for item in session.items
        if isinstance(item, pytest.Function)
    ):
        sys.modules[CHECKOV_MODULE].SCAN.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    module = sys.modules.get(CHECKOV_MODULE)
    if module is not None:
        module.SCAN.stop()
