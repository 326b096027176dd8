-- The seed's schema DDL, verbatim: `const SCHEMA` in experimental-a2 0.5.0,
-- package/src/store-postgres.ts (shared/seeds/002_d080dc556d08ae54.txt,
-- the diff 0.3.0 -> 0.5.0). Its `initializeSchema` runs it as
--   begin; select pg_advisory_xact_lock(hashtext('a2:postgres:schema')); <this>; commit
-- tests/test_pg_schema_lock.py runs it beside a2trio's DDL and checks this copy
-- against the seed text's sha256 (recorded there), and against the seed file
-- itself when that is present.
create table if not exists a2_events (
  session_id   text    not null,
  idx          bigint  not null,
  event_type   text    not null,
  payload      jsonb   not null,
  event_id     text    not null,
  created_at   bigint  not null,
  cause        jsonb,
  lane         text,
  lane_ready   boolean not null default false,
  processed_at bigint,
  processed_by_attempt integer,
  returned_event_ids jsonb,
  first_claimed_at bigint,
  last_claimed_at bigint,
  attempt_count integer not null default 0,
  failure_count integer not null default 0,
  last_failed_at bigint,
  last_failed_attempt integer,
  last_error   text,
  failed_at    bigint,
  claim_holder text,
  claim_expires_at bigint,
  primary key (session_id, idx)
);

create unique index if not exists a2_events_event_id on a2_events (event_id);
create index if not exists a2_events_unprocessed
  on a2_events (session_id, idx) where processed_at is null;
create index if not exists a2_events_lane_pending
  on a2_events (session_id, lane, idx) where processed_at is null;
create index if not exists a2_events_dispatch_ready
  on a2_events (session_id, idx)
  where lane_ready and processed_at is null and failed_at is null;
create index if not exists a2_events_claim_expiry
  on a2_events (session_id, claim_expires_at)
  where lane_ready and processed_at is null and failed_at is null;

create table if not exists a2_snapshots (
  session_id   text   not null,
  reducer_name text   not null,
  up_to_index  bigint not null,
  state        jsonb  not null,
  updated_at   bigint not null,
  primary key (session_id, reducer_name)
);

create table if not exists a2_presence (
  ns          text   not null,
  participant text   not null,
  field       text   not null,
  value       jsonb  not null,
  seen        bigint not null,
  at          bigint not null,
  expires_at  bigint not null,
  primary key (ns, participant, field)
);
