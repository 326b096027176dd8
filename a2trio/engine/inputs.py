"""Inputs: what the engine is handed, checked before anything is written.

* appends (:func:`validate`): every event built with ``contract.event``, its
  id and schema checked, its lane resolved, and marked settled when no
  handler takes its type;
* pushes (:func:`check_push`): what came over the wire, asked of the
  server's ``validate_push``;
* a handler's return value (:func:`returned`): append inputs with
  deterministic ids;
* schedules (:func:`schedule`): a name, a delay or a time and the events,
  handed to the scheduler as an :class:`~a2trio.scheduler.AppendTask`.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ..contract import AppendInput
from ..errors import A2Error, ErrorCode
from ..identifiers import check_event_id
from ..ids import returned_event_id, schedule_id, scheduled_event_id
from ..push import PushedEvent, PushValidation
from ..scheduler import AppendTask, ScheduledEvent
from ..stores.base import AppendEvent, StoredEvent
from .context import Engine
from .flow import FlowKeyError, priority_value, resolve_concurrency, resolve_throttle
from .pacing import DebounceKeyError

__all__ = ["check_push", "delivered", "returned", "schedule", "validate"]

_DELAY = re.compile(r"^(?:0|[1-9]\d*)(?:\.\d+)?(ms|s|m|h|d)$")
_DELAY_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def validate(
    engine: Engine,
    session_id: str,
    events: Sequence[AppendInput | PushedEvent],
    *,
    dispatch: bool = True,
    trace_context: str | None = None,
) -> list[AppendEvent]:
    """Validate append inputs into store records, resolving lanes and
    concurrency keys (:mod:`.flow`) and debounce keys.

    With ``dispatch=False`` (schedules) no lane is resolved and nothing is
    marked settled: the events are appended later, by a scheduler. A
    handler's returned events are debounced as appended ones are (the
    completion's transaction skips what they debounce). ``trace_context``
    is stored with every event (the appender's span), and each event's
    version is its type's current one (``contract.versions``). A debounce
    key that raises or returns a non-string leaves its event undebounced:
    its attempt dead-letters it (``pacing``).

    Raises:
      TypeError: no events, or an input not built with ``contract.event``.
      A2Error: ``UNKNOWN_EVENT_TYPE`` or ``INVALID_PAYLOAD``.
    """
    if not events:
        raise TypeError("append requires at least one event")
    validated = []
    versions = engine.contract.versions
    for event in events:
        if not isinstance(event, AppendInput | PushedEvent):
            raise TypeError(f"append takes events built with contract.event(...), got {event!r}")
        if event.id is not None:
            check_event_id(event.id)
        typed, builtins = engine.contract.validate(event.type, event.payload)
        lane = None
        settled = False
        flow_key: str | None = None
        flow_limit: int | None = None
        throttle: tuple[str | None, int | None, int | None] = (None, None, None)
        priority: int | None = None
        if dispatch:
            if event.type not in engine.lanes:
                settled = True
            else:
                lane_spec = engine.lanes[event.type]
                if lane_spec is not None:
                    lane = (
                        lane_spec
                        if isinstance(lane_spec, str)
                        else lane_spec(session_id, AppendInput(event.type, typed, event.id))
                    )
                    if not isinstance(lane, str) or not lane:
                        raise TypeError(
                            f"lane for {event.type!r} must resolve to a non-empty string, "
                            f"got {lane!r}"
                        )
                concurrency = engine.concurrency.get(event.type)
                if concurrency is not None:
                    flow_key, flow_limit = resolve_concurrency(
                        engine.prefix, concurrency, AppendInput(event.type, typed, event.id)
                    )
                limited = engine.throttle.get(event.type)
                if limited is not None:
                    throttle = resolve_throttle(
                        engine.prefix, limited, AppendInput(event.type, typed, event.id)
                    )
                ranked = engine.priorities.get(event.type)
                if ranked is not None:
                    with contextlib.suppress(FlowKeyError):
                        priority = priority_value(ranked, AppendInput(event.type, typed, event.id))
        delay_ms: int | None = None
        key: str | None = None
        debounced = engine.debounces.get(event.type) if dispatch else None
        if debounced is not None:
            with contextlib.suppress(DebounceKeyError):
                key = debounced.key_of(AppendInput(event.type, typed, event.id))
                delay_ms = debounced.period_ms
        validated.append(
            AppendEvent(
                event.type,
                builtins,
                event.id,
                None,
                lane,
                settled,
                trace_context,
                versions.stored(event.type),
                flow_key,
                flow_limit,
                delay_ms,
                key,
                *throttle,
                priority,
            )
        )
    return validated


async def check_push(engine: Engine, validation: PushValidation) -> None:
    """Ask ``validate_push`` about what came over the wire. It fails closed,
    like ``authorize``: anything but ``True`` refuses.

    Raises:
      A2Error: ``FORBIDDEN`` on a refusal (or what the hook raised).

    Cancellation: the hook's; nothing is written either way.
    """
    if engine.validate_push is None:
        return
    verdict: object = engine.validate_push(validation)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    if verdict is not True:
        raise A2Error(ErrorCode.FORBIDDEN, "validate_push refused the push")


def returned(engine: Engine, trigger: StoredEvent, result: Any) -> list[AppendEvent]:
    """A handler's return value as validated records with deterministic ids,
    in the trace of the span current here (the handler's ``a2.event``).

    Raises:
      TypeError: not None, an append input or a list of them.
    """
    if result is None:
        return []
    items = [result] if isinstance(result, AppendInput) else list(result)
    if not all(isinstance(item, AppendInput) for item in items):
        raise TypeError(
            f"a handler returns None, an append input or a list of them, got {result!r}"
        )
    session_id = trigger.session_id[len(engine.prefix) :]
    with_ids = [
        AppendInput(e.type, e.payload, e.id or returned_event_id(trigger.id, position))
        for position, e in enumerate(items)
    ]
    return validate(
        engine,
        session_id,
        with_ids,
        trace_context=engine.telemetry.trace_context(),
    )


async def schedule(
    engine: Engine,
    session_id: str,
    name: str,
    timing: str | datetime,
    events: Sequence[AppendInput],
    trigger: StoredEvent | None,
) -> None:
    """Queue a delayed append (see ``Session.schedule``); with a ``trigger``
    the schedule id includes its id and delays count from its creation.

    Raises:
      TypeError: no scheduler, an empty name, no events, bad timing.
      A2Error: a bad payload, or ``PARTIAL_DUPLICATE_BATCH`` for an id twice.

    Cancellation: the scheduler's; the schedule id makes a retry a no-op.
    """
    if engine.scheduler is None:
        raise TypeError("schedule requires a scheduler: pass Server(scheduler=...)")
    if not isinstance(name, str) or not name:
        raise TypeError(f"schedule name must be a non-empty string, got {name!r}")
    if not events:
        raise TypeError("schedule requires at least one event")
    base_ms = trigger.created_at_ms if trigger is not None else engine.clock.now_ms()
    due_at_ms = _due_at(timing, base_ms)
    validated = validate(engine, session_id, events, dispatch=False)
    sid = schedule_id(
        engine.contract.name, session_id, trigger.id if trigger is not None else None, name
    )
    scheduled = [
        ScheduledEvent(
            e.id or scheduled_event_id(sid, position),
            e.type,
            e.payload,
            msgspec.UNSET if e.version is None else e.version,
        )
        for position, e in enumerate(validated)
    ]
    if len({e.id for e in scheduled}) != len(scheduled):
        raise A2Error(
            ErrorCode.PARTIAL_DUPLICATE_BATCH,
            "scheduled batch contains the same event id more than once",
        )
    # The delivered append continues the scheduling span's trace.
    trace = engine.telemetry.trace_context()
    await engine.scheduler.schedule(
        AppendTask(
            sid,
            engine.contract.name,
            session_id,
            due_at_ms,
            scheduled,
            trace_context=msgspec.UNSET if trace is None else trace,
        )
    )


def delivered(engine: Engine, task: AppendTask) -> list[AppendInput]:
    """A delivered append's events as append inputs, each payload upcast from
    the version it was scheduled at when that is not its type's current one
    (a task an older release queued); :func:`validate` checks them as it
    checks any append.

    Raises:
      UpcastError: a payload that cannot be read as the current version.
    """
    contract = engine.contract
    inputs = []
    for e in task.events:
        payload = e.payload
        version = None if isinstance(e.version, msgspec.UnsetType) else e.version
        if version != contract.versions.stored(e.type):
            payload = contract.upcast(
                e.type, payload, version, session_id=task.session_id, index=None, event_id=e.id
            )
        inputs.append(AppendInput(e.type, payload, e.id))
    return inputs


def _due_at(timing: str | datetime, base_ms: int) -> int:
    if isinstance(timing, datetime):
        if timing.tzinfo is None:
            raise TypeError(f"schedule at must be an aware datetime, got naive {timing!r}")
        return int(timing.timestamp() * 1000)
    if not isinstance(timing, str):
        raise TypeError(
            f"schedule timing must be a delay like '30s' or an aware datetime, got {timing!r}"
        )
    match = _DELAY.match(timing)
    amount = float(timing[: -len(match.group(1))]) if match else 0.0
    if match is None or not amount > 0:
        raise TypeError(
            f"schedule delay must be positive and use ms, s, m, h or d (for example '30s'), "
            f"got {timing!r}"
        )
    due = base_ms + amount * _DELAY_MS[match.group(1)]
    if not math.isfinite(due):
        raise TypeError(f"schedule due time must be finite, got {timing!r}")
    return math.ceil(due)
