"""Fixtures shared by the unit tests."""

from __future__ import annotations

from tests.unit.faultfs import faultfs as faultfs  # the filesystem fault layer
