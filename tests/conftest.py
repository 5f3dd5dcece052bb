"""Shared pytest setup: opt-in markers and helpers available to every test folder."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``wan`` tests need root and network namespaces: they run only with SWARMTRAIN_WAN=1."""
    if os.environ.get("SWARMTRAIN_WAN") == "1":
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("wan") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
