"""A small contract shared by the engine tests."""

from __future__ import annotations

import msgspec

import a2trio


class Ordered(msgspec.Struct, frozen=True):
    item: str
    qty: int = 1


class Shipped(msgspec.Struct, frozen=True):
    item: str


class Note(msgspec.Struct, frozen=True):
    text: str


class Cancelled(msgspec.Struct, frozen=True):
    item: str


class Cursor(msgspec.Struct, frozen=True):
    x: int
    y: int


orders = a2trio.contract(
    "orders",
    events={
        "ordered": Ordered,
        "shipped": Shipped,
        "note": Note,
        "cancelled": Cancelled,
    },
)

rooms = a2trio.contract(
    "rooms",
    events={"note": Note},
    presence={"cursor": Cursor, "typing": bool},
)
