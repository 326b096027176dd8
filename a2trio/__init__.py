"""a2trio: durable, event-sourced sessions for Trio.

An app declares a :func:`contract` (of :func:`event_type` handles, typed by
their payloads); a :class:`Server` binds it to a store and to handlers
(:func:`on`). Appends are durable; handlers claim events under leases, run in
nurseries, and complete, fail and retry, or dead-letter. See ``docs/``.

``a2trio.testing`` (fixtures and helpers for your own tests) is imported
explicitly, like ``trio.testing``.
"""

from __future__ import annotations

from . import schedulers, stores
from .actor import Actor, ActorCall, Refused, actor, call
from .clock import SYSTEM_CLOCK, Clock, SystemClock, TrioClock
from .contract import AppendInput, Contract, Event, EventType, Reducer, contract, event_type
from .engine.actor_calls import ActorHandle, ActorState
from .engine.crons import Cron, CronInfo, cron
from .engine.drain import DrainResult
from .engine.fanout import FeedEntry, Lapped, Subscription
from .engine.flow import Concurrency, Throttle
from .engine.handlers import HandlerContext, HandlerSpec, Returned, handler, on
from .engine.inspection import InspectionUnsupportedError
from .engine.pacing import Debounce, Retry
from .engine.presence import PresenceMap, PresencePatch, PresenceSnapshot, PresenceValue
from .engine.session import HandlerSession, Session
from .engine.transaction import Transaction
from .errors import A2Error, ErrorCode, SqlError
from .push import PushedEvent, PushedPresence, PushValidation
from .scheduler import (
    AppendTask,
    DrainTask,
    ScheduledEvent,
    Scheduler,
    SchedulerTarget,
    SchedulerTask,
)
from .schedulers import DurableScheduler, LocalScheduler
from .server import Server
from .stores.base import (
    ArchivedSnapshot,
    Erased,
    FailedAttempt,
    OperatorAction,
    OperatorActionError,
    RetentionError,
    SessionArchive,
    Store,
    Trimmed,
)
from .telemetry import (
    NOOP_TELEMETRY,
    Metrics,
    Span,
    Telemetry,
    decode_trace_context,
    encode_trace_context,
)
from .timings import DEFAULT_TIMINGS, Timings
from .tuning import tune_gc
from .upcasting import UpcastError

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMINGS",
    "NOOP_TELEMETRY",
    "SYSTEM_CLOCK",
    "A2Error",
    "Actor",
    "ActorCall",
    "ActorHandle",
    "ActorState",
    "AppendInput",
    "AppendTask",
    "ArchivedSnapshot",
    "Clock",
    "Concurrency",
    "Contract",
    "Cron",
    "CronInfo",
    "Debounce",
    "DrainResult",
    "DrainTask",
    "DurableScheduler",
    "Erased",
    "ErrorCode",
    "Event",
    "EventType",
    "FailedAttempt",
    "FeedEntry",
    "HandlerContext",
    "HandlerSession",
    "HandlerSpec",
    "InspectionUnsupportedError",
    "Lapped",
    "LocalScheduler",
    "Metrics",
    "OperatorAction",
    "OperatorActionError",
    "PresenceMap",
    "PresencePatch",
    "PresenceSnapshot",
    "PresenceValue",
    "PushValidation",
    "PushedEvent",
    "PushedPresence",
    "Reducer",
    "Refused",
    "RetentionError",
    "Retry",
    "Returned",
    "ScheduledEvent",
    "Scheduler",
    "SchedulerTarget",
    "SchedulerTask",
    "Server",
    "Session",
    "SessionArchive",
    "Span",
    "SqlError",
    "Store",
    "Subscription",
    "SystemClock",
    "Telemetry",
    "Throttle",
    "Timings",
    "Transaction",
    "Trimmed",
    "TrioClock",
    "UpcastError",
    "actor",
    "call",
    "contract",
    "cron",
    "decode_trace_context",
    "encode_trace_context",
    "event_type",
    "handler",
    "on",
    "schedulers",
    "stores",
    "tune_gc",
]
