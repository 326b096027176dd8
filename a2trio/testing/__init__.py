"""Helpers for testing a2trio apps under Trio's mock clock, and a pytest plugin.

Imported explicitly (``import a2trio.testing``), never by ``import a2trio``.
"""

from __future__ import annotations

from ..clock import TrioClock

__all__ = ["TrioClock"]
