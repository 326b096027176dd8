"""One trace from an HTTP push to its handler in another process (issue 18).

Two ``python -m a2trio.serve`` processes of ``examples/tracing.py`` share a
SQLite file: the API takes the push and runs no handlers; the worker's sweep
finds the event and runs it. Each writes its OpenTelemetry spans to its own
file (``SPANS_FILE``). The push carries a W3C ``traceparent``; the worker's spans must continue it
through the trace context stored with each event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from .serve_kit import start_serve

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"

Span = dict[str, Any]


@asynccontextmanager
async def serving(target: str, db: Path, spans: Path) -> AsyncIterator[str]:
    """Run ``python -m a2trio.serve`` on ``target``; yield its base URL."""
    started = await start_serve(
        target, "--store", f"sqlite:///{db}", "--port", "0", env={"SPANS_FILE": str(spans)}
    )
    try:
        yield started.url
    finally:
        started.process.kill()
        await started.process.wait()


def read_spans(path: Path) -> list[Span]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(spans: list[Span]) -> bool:
    """Whether the worker has run the ``shipped`` event, the last of the trace,
    and ended the drains its events link (a drain ends after its events)."""
    drains = {s["span_id"] for s in spans if s["name"] == "a2.drain"}
    events = [s for s in spans if s["name"] == "a2.event"]
    return any(e["attributes"]["a2.event.type"] == "shipped" for e in events) and all(
        set(e["links"]) <= drains for e in events
    )


def one(spans: list[Span], name: str, **attributes: object) -> Span:
    found = [
        s
        for s in spans
        if s["name"] == name
        and all(
            s["attributes"].get(f"a2.{k.replace('_', '.')}") == v for k, v in attributes.items()
        )
    ]
    assert len(found) == 1, (name, attributes, spans)
    return found[0]


async def test_a_push_and_its_handlers_in_another_process_are_one_trace(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    api_spans, worker_spans = tmp_path / "api.jsonl", tmp_path / "worker.jsonl"
    async with (
        serving("examples.tracing:api", db, api_spans) as api,
        serving("examples.tracing:worker", db, worker_spans),
        httpx.AsyncClient(base_url=api) as http,
    ):
        response = await http.post(
            "/shop/o1",
            json={"events": [{"type": "ordered", "payload": {"item": "book"}}]},
            headers={"traceparent": f"00-{TRACE}-{CALLER}-01"},
        )
        assert response.status_code == 200, response.text
        with trio.fail_after(60):
            while not finished(read_spans(worker_spans)):  # noqa: ASYNC110 (another process)
                await trio.sleep(0.05)

    [push] = read_spans(api_spans)
    assert push["name"] == "a2.append"
    assert (push["trace_id"], push["parent_id"]) == (TRACE, CALLER)
    worker = read_spans(worker_spans)
    ordered = one(worker, "a2.event", event_type="ordered")
    shipped = one(worker, "a2.event", event_type="shipped")
    note = one(worker, "a2.append", append_source="handler")
    # The worker's drains are its own traces; each event continues the trace
    # that appended it and links the drain that ran it.
    drains = {s["span_id"]: s for s in worker if s["name"] == "a2.drain"}
    assert all(d["trace_id"] != TRACE and d["parent_id"] is None for d in drains.values())
    assert (ordered["trace_id"], ordered["parent_id"]) == (TRACE, push["span_id"])
    assert ordered["attributes"]["a2.event.outcome"] == "processed"
    assert (note["trace_id"], note["parent_id"]) == (TRACE, ordered["span_id"])
    assert (shipped["trace_id"], shipped["parent_id"]) == (TRACE, ordered["span_id"])
    assert shipped["attributes"]["a2.event.outcome"] == "processed"
    for event in (ordered, shipped):
        [drain] = event["links"]
        assert drain in drains
