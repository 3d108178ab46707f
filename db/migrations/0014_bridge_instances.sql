-- The bridges that say they are alive (db/functions/84_bridges.sql): one row per running
-- bridge, written every few seconds by its schedule tick (arm.record_bridge), so a
-- process that runs no bridge itself — `arm-core serve` with NATS_ENABLED=false, the
-- console of a deployment whose bridges run apart — can show each one's NATS and LISTEN
-- state and when it was last seen. A bridge that stops cleanly deletes its row
-- (arm.forget_bridge); one that died stays, its seen_at growing old, until a day later.
-- Every row is updated every few seconds, so half of each page is left free for the
-- new versions (heap-only updates: the primary key's entry is not rewritten).
-- depends: 0013_time_ordered_ids

CREATE TABLE arm.bridge_instance (
    name       text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    version    text NOT NULL CHECK (length(version) <= 100),
    started_at timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    nats       text NOT NULL CHECK (length(nats) <= 40),
    listener   text NOT NULL CHECK (length(listener) <= 40),
    -- The loops restarting, stalled or failed, by name, with their state ("failed: …").
    loops      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(loops) = 'object'),
    -- Answers the bridge holds, received and not yet applied.
    held       integer NOT NULL CHECK (held >= 0)
) WITH (fillfactor = 50);
