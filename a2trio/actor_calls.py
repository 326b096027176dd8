"""Moved to :mod:`a2trio.engine.actor_calls`; this path stays for the names the
docs give it (``a2trio.actor_calls.MAX_CALL_ATTEMPTS``)."""

from .engine.actor_calls import MAX_CALL_ATTEMPTS, ActorCalls, ActorHandle, ActorState

__all__ = ["MAX_CALL_ATTEMPTS", "ActorCalls", "ActorHandle", "ActorState"]
