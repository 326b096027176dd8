"""Moved to :mod:`a2trio.engine.session`; this path stays for the names the
docs give it (``a2trio.session.MAX_HISTORY_EVENTS``)."""

from .engine.session import MAX_HISTORY_EVENTS, HandlerSession, Session, SessionView

__all__ = ["MAX_HISTORY_EVENTS", "HandlerSession", "Session", "SessionView"]
