"""The store conformance suite: ``a2trio.stores.base`` as executable checks.

Every backend passes these checks unchanged. Each one is a plain coroutine
function over a :data:`StoreFactory`, with no pytest in sight (like trio's
``check_two_way_stream``), so a third-party store runs them with any runner::

    from a2trio.stores.conformance import CHECKS, REQUIRES, capabilities

    has = trio.run(capabilities, open_my_store)
    for check in CHECKS:
        if REQUIRES.get(check.__name__, frozenset()) <= has:
            trio.run(check, open_my_store)

``open_my_store(clock)`` is an async context manager yielding a fresh, entered
store that stamps rows with ``clock`` (a :class:`ManualClock`)::

    @asynccontextmanager
    async def open_my_store(clock: Clock) -> AsyncIterator[Store]:
        async with MyStore(clock=clock) as store:
            yield store

A check that needs a capability the store lacks raises :class:`CapabilityMissing`
(the loop above skips it first); under pytest, ``tests/test_conformance.py``
parametrizes over :data:`CHECKS` and the backends of ``tests/backends/``. A factory that
also takes ``ids=`` (an :class:`~a2trio.ids.IdSource`, passed to the store)
gains the ``ids`` capability and runs
:func:`check_generated_ids_come_from_the_id_source`; every other check calls
it with the clock alone, so a clock-only factory keeps working (that check is
skipped).

The semantics are the seed's ``store-postgres.ts``, statement by statement.
Rules the checks keep, so that one database can serve them all:

* every session id carries a random suffix, so checks never see each other's
  rows (a factory may share one database between checks);
* store time moves only through :class:`ManualClock`, never by sleeping;
* live feeds and presence pushes are awaited under ``trio.fail_after(5)``,
  which covers a polling backend (sqlite polls every 25 ms) and Postgres
  ``NOTIFY`` alike.

A check fails with ``AssertionError`` naming what the store got wrong.

:data:`UNREACHABLE_CHECKS` take another factory, ``open_unreachable_store(clock)``,
yielding a store (not entered) that points at a backend that cannot be
reached (a port where nothing listens): every call, every async method of
the protocols in ``base.py`` included, raises ``A2Error(STORE_UNAVAILABLE)``
with the cause, translated once inside the store::

    for check in UNREACHABLE_CHECKS:
        trio.run(check, open_my_unreachable_store)

One module per capability of the store, each a list of checks over what
``kit`` shares (the clock, the factory type, the helpers that name sessions
and build rows):

* ``appends``: append and read, ids, replays, the cause fence, ``find_event``;
* ``lifecycle``: cancelled calls, ``aclose``;
* ``claims``: ``claim_available``, lanes, the sweep, ``renew_claims``;
* ``completions``: ``complete_attempt`` and ``fail_attempt``;
* ``notbefore``: the stored not-before (``release_attempt``, a failure's
  ``retry_after_ms``) against claims, lanes and the sweep;
* ``waits``: suspended attempts' wake marks (``release_attempt(wake_on=)``);
* ``flow``: concurrency keys across sessions (``rules.flow``);
* ``failed_attempts``: the failed attempts ``fail_attempt`` records and
  ``inspect.read_failures`` reads (bounded per event);
* ``debounce``: debounced appends (``AppendEvent.debounce_key``);
* ``states``: snapshots, ``read_state`` and ``read_states``;
* ``feeds``: ``stream``;
* ``presence``, ``inspection``, ``operator``, ``retention``,
  ``transactions`` (the app's own transaction), ``journal`` (durable
  handlers' steps): the optional capabilities;
* ``verdicts``: the rule table of :mod:`a2trio.stores.rules` (``CASES``), every
  case built and asked through the public API, so a backend's spelling of a
  rule that drifts fails by the rule's name and its starting state;
* ``versions``: each event's schema version, stored and read back;
* ``failures``: :data:`UNREACHABLE_CHECKS`.

A new check goes in its capability's module and into :data:`CHECKS` here, in
the order of ``base.py``'s obligations (and into :data:`REQUIRES` if it needs
an optional capability); ``tests/test_conformance.py`` fails on a check that a
module defines and no list names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .appends import (
    check_append_assigns_contiguous_indexes,
    check_append_cause_fence,
    check_append_concurrent_writers,
    check_append_empty_batch_reports_pending,
    check_append_expected_index,
    check_append_payload_round_trip,
    check_append_rejects_partial_duplicates,
    check_append_replays_a_stored_batch,
    check_append_stores_settled_events_processed,
    check_append_supplied_ids_are_unique_across_the_store,
    check_append_with_claim,
    check_find_event,
    check_generated_ids_come_from_the_id_source,
    check_identifiers_and_values_at_the_limits,
    check_read_bounds,
    check_trace_context_is_stored_with_the_event,
)
from .claims import (
    check_claim_available,
    check_claim_concurrent_holders,
    check_claim_dead_letters_block_their_lane,
    check_claim_exclude_and_busy,
    check_claim_lane_hand_off_to_returned_events,
    check_claim_lanes,
    check_claim_limit,
    check_claimable_sessions,
    check_renew_claims,
)
from .completions import (
    check_complete_attempt,
    check_complete_attempt_drained_hint,
    check_complete_attempt_fences_zombies,
    check_complete_attempt_rejects_a_different_batch,
    check_complete_attempt_replay_keeps_types,
    check_fail_attempt,
)
from .debounce import (
    check_debounce_applies_to_returned_events,
    check_debounce_hands_lanes_on_and_replays,
    check_debounce_leaves_running_events_alone,
    check_debounce_skips_earlier_events_of_its_key,
)
from .failed_attempts import (
    check_failed_attempts_are_bounded,
    check_failed_attempts_are_erased_with_their_session,
    check_failed_attempts_are_recorded_with_each_failure,
)
from .failures import (
    UNREACHABLE_DEADLINE_S,
    check_every_call_fails_unavailable_when_unreachable,
    check_every_protocol_method_fails_unavailable_translated_once,
)
from .feeds import (
    check_stream_catches_up_then_follows,
    check_stream_close_stops_the_feed,
    check_stream_concurrent_feeds,
)
from .flow import (
    check_concurrency_across_sessions,
    check_concurrency_at_insert,
    check_concurrency_slots_are_leases,
    check_concurrency_with_lanes_and_the_sweep,
    check_concurrency_within_a_session,
    check_priority_orders_a_claim,
    check_throttle_across_sessions,
    check_throttle_within_a_session_and_the_sweep,
)
from .inspection import (
    check_inspect_list_sessions,
    check_inspect_read_events_and_snapshots,
)
from .journal import (
    check_journal_erased_with_its_session,
    check_journal_fence,
    check_journal_steps,
)
from .kit import (
    FEED_DEADLINE_S,
    CapabilityMissing,
    ManualClock,
    StoreFactory,
    capabilities,
    raises,
)
from .lifecycle import (
    check_aclose_inside_the_block_ends_only_the_stores_tasks,
    check_aclose_is_idempotent,
    check_cancelled_calls_commit_all_or_nothing,
)
from .notbefore import (
    check_fail_attempt_stores_a_retry_at,
    check_not_before_holds_its_lane_and_the_sweep,
    check_release_attempt,
)
from .operator import (
    check_operator_dead_letters,
    check_operator_redrive,
    check_operator_retry_now,
    check_operator_skip,
    refused,
)
from .presence import (
    check_presence_expiry_and_order,
    check_presence_last_writer_wins,
    check_presence_subscribe,
)
from .retention import (
    check_retention_cancelled_removals_are_all_or_nothing,
    check_retention_erase_is_refused_while_claimed,
    check_retention_erase_races_a_claim,
    check_retention_export_and_erase,
    check_retention_trim,
    check_retention_trim_keeps_work_and_the_last_event,
    rejected,
)
from .states import (
    check_read_states,
    check_snapshots,
)
from .transactions import (
    check_transaction_appends_keep_the_verdicts,
    check_transaction_commits_with_the_apps_rows,
    check_transaction_holds_its_sessions,
    check_transaction_rolls_back_with_the_apps_rows,
)
from .verdicts import (
    check_rule_table_claims_and_outcomes,
    check_rule_table_operator_actions,
    check_rule_table_sweep,
)
from .versions import check_version_is_stored_with_the_event
from .waits import (
    check_a_marked_event_wakes_a_released_attempt,
    check_a_release_sees_what_landed_after_its_read,
    check_a_stale_mark_wakes_nothing,
    check_operator_wake,
)

__all__ = [
    "CHECKS",
    "FEED_DEADLINE_S",
    "REQUIRES",
    "UNREACHABLE_CHECKS",
    "UNREACHABLE_DEADLINE_S",
    "CapabilityMissing",
    "ManualClock",
    "StoreFactory",
    "capabilities",
    "check_a_marked_event_wakes_a_released_attempt",
    "check_a_release_sees_what_landed_after_its_read",
    "check_a_stale_mark_wakes_nothing",
    "check_aclose_inside_the_block_ends_only_the_stores_tasks",
    "check_aclose_is_idempotent",
    "check_append_assigns_contiguous_indexes",
    "check_append_cause_fence",
    "check_append_concurrent_writers",
    "check_append_empty_batch_reports_pending",
    "check_append_expected_index",
    "check_append_payload_round_trip",
    "check_append_rejects_partial_duplicates",
    "check_append_replays_a_stored_batch",
    "check_append_stores_settled_events_processed",
    "check_append_supplied_ids_are_unique_across_the_store",
    "check_append_with_claim",
    "check_cancelled_calls_commit_all_or_nothing",
    "check_claim_available",
    "check_claim_concurrent_holders",
    "check_claim_dead_letters_block_their_lane",
    "check_claim_exclude_and_busy",
    "check_claim_lane_hand_off_to_returned_events",
    "check_claim_lanes",
    "check_claim_limit",
    "check_claimable_sessions",
    "check_complete_attempt",
    "check_complete_attempt_drained_hint",
    "check_complete_attempt_fences_zombies",
    "check_complete_attempt_rejects_a_different_batch",
    "check_complete_attempt_replay_keeps_types",
    "check_concurrency_across_sessions",
    "check_concurrency_at_insert",
    "check_concurrency_slots_are_leases",
    "check_concurrency_with_lanes_and_the_sweep",
    "check_concurrency_within_a_session",
    "check_debounce_applies_to_returned_events",
    "check_debounce_hands_lanes_on_and_replays",
    "check_debounce_leaves_running_events_alone",
    "check_debounce_skips_earlier_events_of_its_key",
    "check_every_call_fails_unavailable_when_unreachable",
    "check_every_protocol_method_fails_unavailable_translated_once",
    "check_fail_attempt",
    "check_fail_attempt_stores_a_retry_at",
    "check_failed_attempts_are_bounded",
    "check_failed_attempts_are_erased_with_their_session",
    "check_failed_attempts_are_recorded_with_each_failure",
    "check_find_event",
    "check_generated_ids_come_from_the_id_source",
    "check_identifiers_and_values_at_the_limits",
    "check_inspect_list_sessions",
    "check_inspect_read_events_and_snapshots",
    "check_journal_erased_with_its_session",
    "check_journal_fence",
    "check_journal_steps",
    "check_not_before_holds_its_lane_and_the_sweep",
    "check_operator_dead_letters",
    "check_operator_redrive",
    "check_operator_retry_now",
    "check_operator_skip",
    "check_operator_wake",
    "check_presence_expiry_and_order",
    "check_presence_last_writer_wins",
    "check_presence_subscribe",
    "check_priority_orders_a_claim",
    "check_read_bounds",
    "check_read_states",
    "check_release_attempt",
    "check_renew_claims",
    "check_retention_cancelled_removals_are_all_or_nothing",
    "check_retention_erase_is_refused_while_claimed",
    "check_retention_erase_races_a_claim",
    "check_retention_export_and_erase",
    "check_retention_trim",
    "check_retention_trim_keeps_work_and_the_last_event",
    "check_rule_table_claims_and_outcomes",
    "check_rule_table_operator_actions",
    "check_rule_table_sweep",
    "check_snapshots",
    "check_stream_catches_up_then_follows",
    "check_stream_close_stops_the_feed",
    "check_stream_concurrent_feeds",
    "check_throttle_across_sessions",
    "check_throttle_within_a_session_and_the_sweep",
    "check_trace_context_is_stored_with_the_event",
    "check_transaction_appends_keep_the_verdicts",
    "check_transaction_commits_with_the_apps_rows",
    "check_transaction_holds_its_sessions",
    "check_transaction_rolls_back_with_the_apps_rows",
    "check_version_is_stored_with_the_event",
    "raises",
    "refused",
    "rejected",
]

CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_append_assigns_contiguous_indexes,
    check_append_supplied_ids_are_unique_across_the_store,
    check_generated_ids_come_from_the_id_source,
    check_append_replays_a_stored_batch,
    check_append_rejects_partial_duplicates,
    check_append_empty_batch_reports_pending,
    check_append_stores_settled_events_processed,
    check_append_cause_fence,
    check_append_payload_round_trip,
    check_identifiers_and_values_at_the_limits,
    check_append_with_claim,
    check_append_concurrent_writers,
    check_append_expected_index,
    check_find_event,
    check_trace_context_is_stored_with_the_event,
    check_version_is_stored_with_the_event,
    check_cancelled_calls_commit_all_or_nothing,
    check_aclose_is_idempotent,
    check_aclose_inside_the_block_ends_only_the_stores_tasks,
    check_read_bounds,
    check_claim_available,
    check_claim_limit,
    check_claim_concurrent_holders,
    check_claim_exclude_and_busy,
    check_claim_lanes,
    check_claim_lane_hand_off_to_returned_events,
    check_claim_dead_letters_block_their_lane,
    check_claimable_sessions,
    check_renew_claims,
    check_complete_attempt,
    check_complete_attempt_rejects_a_different_batch,
    check_complete_attempt_replay_keeps_types,
    check_complete_attempt_fences_zombies,
    check_complete_attempt_drained_hint,
    check_fail_attempt,
    check_release_attempt,
    check_fail_attempt_stores_a_retry_at,
    check_not_before_holds_its_lane_and_the_sweep,
    check_a_marked_event_wakes_a_released_attempt,
    check_a_release_sees_what_landed_after_its_read,
    check_a_stale_mark_wakes_nothing,
    check_concurrency_across_sessions,
    check_concurrency_at_insert,
    check_concurrency_slots_are_leases,
    check_concurrency_within_a_session,
    check_concurrency_with_lanes_and_the_sweep,
    check_failed_attempts_are_recorded_with_each_failure,
    check_failed_attempts_are_bounded,
    check_debounce_skips_earlier_events_of_its_key,
    check_debounce_leaves_running_events_alone,
    check_debounce_hands_lanes_on_and_replays,
    check_debounce_applies_to_returned_events,
    check_throttle_across_sessions,
    check_throttle_within_a_session_and_the_sweep,
    check_priority_orders_a_claim,
    check_snapshots,
    check_read_states,
    check_stream_catches_up_then_follows,
    check_stream_concurrent_feeds,
    check_stream_close_stops_the_feed,
    check_presence_last_writer_wins,
    check_presence_expiry_and_order,
    check_presence_subscribe,
    check_inspect_list_sessions,
    check_inspect_read_events_and_snapshots,
    check_operator_redrive,
    check_operator_skip,
    check_operator_retry_now,
    check_operator_dead_letters,
    check_operator_wake,
    check_journal_steps,
    check_journal_fence,
    check_journal_erased_with_its_session,
    check_rule_table_claims_and_outcomes,
    check_rule_table_sweep,
    check_rule_table_operator_actions,
    check_retention_export_and_erase,
    check_retention_erase_is_refused_while_claimed,
    check_transaction_commits_with_the_apps_rows,
    check_transaction_rolls_back_with_the_apps_rows,
    check_transaction_appends_keep_the_verdicts,
    check_transaction_holds_its_sessions,
    check_failed_attempts_are_erased_with_their_session,
    check_retention_trim,
    check_retention_trim_keeps_work_and_the_last_event,
    check_retention_cancelled_removals_are_all_or_nothing,
    check_retention_erase_races_a_claim,
]
"""Every check, in the order of ``base.py``'s obligations."""

UNREACHABLE_CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_every_call_fails_unavailable_when_unreachable,
    check_every_protocol_method_fails_unavailable_translated_once,
]
"""The checks run with another factory, ``open_unreachable_store(clock)``: it
yields a fresh store, not entered, whose backend cannot be reached (a port
where nothing listens, a path that cannot be opened), and closes it on exit.
A store without a backend to lose (memory) has none."""

#: The optional capabilities each check needs, by check name. A check run on a
#: store without them raises :class:`CapabilityMissing`.
REQUIRES: dict[str, frozenset[str]] = {
    check_presence_last_writer_wins.__name__: frozenset({"presence"}),
    check_presence_expiry_and_order.__name__: frozenset({"presence"}),
    check_presence_subscribe.__name__: frozenset({"presence", "presence push"}),
    check_inspect_list_sessions.__name__: frozenset({"inspect"}),
    check_inspect_read_events_and_snapshots.__name__: frozenset({"inspect"}),
    check_failed_attempts_are_recorded_with_each_failure.__name__: frozenset({"inspect"}),
    check_failed_attempts_are_bounded.__name__: frozenset({"inspect"}),
    check_failed_attempts_are_erased_with_their_session.__name__: frozenset(
        {"inspect", "retention"}
    ),
    check_claimable_sessions.__name__: frozenset({"sweep"}),
    check_generated_ids_come_from_the_id_source.__name__: frozenset({"ids"}),
    check_operator_redrive.__name__: frozenset({"operator"}),
    check_operator_skip.__name__: frozenset({"operator"}),
    check_operator_retry_now.__name__: frozenset({"operator"}),
    check_operator_dead_letters.__name__: frozenset({"operator"}),
    check_operator_wake.__name__: frozenset({"operator"}),
    check_rule_table_sweep.__name__: frozenset({"sweep"}),
    check_journal_steps.__name__: frozenset({"journal"}),
    check_journal_fence.__name__: frozenset({"journal"}),
    check_journal_erased_with_its_session.__name__: frozenset({"journal", "retention"}),
    check_concurrency_with_lanes_and_the_sweep.__name__: frozenset({"sweep"}),
    check_throttle_within_a_session_and_the_sweep.__name__: frozenset({"sweep"}),
    check_rule_table_operator_actions.__name__: frozenset({"operator"}),
    check_retention_export_and_erase.__name__: frozenset({"retention"}),
    check_retention_erase_is_refused_while_claimed.__name__: frozenset({"retention"}),
    check_transaction_commits_with_the_apps_rows.__name__: frozenset({"transactions"}),
    check_transaction_rolls_back_with_the_apps_rows.__name__: frozenset({"transactions"}),
    check_transaction_appends_keep_the_verdicts.__name__: frozenset({"transactions"}),
    check_transaction_holds_its_sessions.__name__: frozenset({"transactions"}),
    check_retention_trim.__name__: frozenset({"retention"}),
    check_retention_trim_keeps_work_and_the_last_event.__name__: frozenset({"retention"}),
    check_retention_cancelled_removals_are_all_or_nothing.__name__: frozenset({"retention"}),
    check_retention_erase_races_a_claim.__name__: frozenset({"retention"}),
}
