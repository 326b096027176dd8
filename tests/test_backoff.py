"""The one backoff (``a2trio.backoff``) and the schedules built on it."""

from __future__ import annotations

import pytest

from a2trio.backoff import STORE_RECONNECT, Backoff
from a2trio.schedulers._engine import REDELIVERY, retry_delay_s
from a2trio.stores import rules
from a2trio.transport import Backoff as TransportBackoff


def test_the_transport_backoff_is_the_one_backoff() -> None:
    assert TransportBackoff is Backoff


def test_attempts_below_one_count_as_the_first() -> None:
    assert Backoff(base_s=1.0, jitter=0.0).delay(0) == 1.0
    assert Backoff(base_s=1.0, jitter=0.0).delay(-3) == 1.0


@pytest.mark.parametrize(
    ("schedule", "delays"),
    [
        (STORE_RECONNECT, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]),
        (REDELIVERY, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),
        (rules.EVENT_RETRY, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),
    ],
    ids=["store reconnect", "scheduler redelivery", "event retry"],
)
def test_each_schedule_doubles_to_its_cap_without_jitter(
    schedule: Backoff, delays: list[float]
) -> None:
    assert [schedule.delay(n) for n in range(1, 9)] == pytest.approx(delays)


def test_redelivery_waits_a_second_before_the_first_failure_too() -> None:
    assert retry_delay_s(0) == retry_delay_s(1) == 1.0
