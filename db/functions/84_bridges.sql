-- The bridges that say they are alive (arm.bridge_instance, migration 0014). A DBA sees
-- them with:
--   SELECT name, version, nats, listener, loops, held, seen_seconds_ago
--   FROM arm.bridge_instances();
-- A row whose seen_seconds_ago grows is a bridge that stopped saying so: it died, or it
-- cannot reach the database. PL/pgSQL, as the other files' functions of later tables:
-- their bodies are checked when called, so every file applies to a database migrated
-- only part of the way (as the migrations' own tests do).

-- Writes the bridge's row (its schedule tick, every few seconds): what it runs, its NATS
-- and LISTEN state, its loops in trouble and the answers it holds. Deletes
-- the rows no bridge has written for a day (bridges that died long ago).
CREATE OR REPLACE FUNCTION arm.record_bridge(
    p_name text,
    p_version text,
    p_started_at timestamptz,
    p_nats text,
    p_listener text,
    p_loops jsonb,
    p_held integer
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    INSERT INTO arm.bridge_instance AS b
        (name, version, started_at, seen_at, nats, listener, loops, held)
    VALUES (p_name, p_version, p_started_at, clock_timestamp(), p_nats, p_listener,
            coalesce(p_loops, '{}'), p_held)
    ON CONFLICT (name) DO UPDATE
    SET version = EXCLUDED.version,
        started_at = EXCLUDED.started_at,
        seen_at = EXCLUDED.seen_at,
        nats = EXCLUDED.nats,
        listener = EXCLUDED.listener,
        loops = EXCLUDED.loops,
        held = EXCLUDED.held;
    DELETE FROM arm.bridge_instance WHERE seen_at < clock_timestamp() - interval '1 day';
END
$$;

-- Deletes the bridge's row: it is stopping cleanly, and its absence is not an alarm.
CREATE OR REPLACE FUNCTION arm.forget_bridge(p_name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    DELETE FROM arm.bridge_instance WHERE name = p_name;
    RETURN FOUND;
END
$$;

-- Every bridge seen in the last day, the most recently seen first, with how long ago.
CREATE OR REPLACE FUNCTION arm.bridge_instances()
RETURNS TABLE (
    name text,
    version text,
    started_at timestamptz,
    seen_seconds_ago double precision,
    nats text,
    listener text,
    loops jsonb,
    held integer
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT b.name, b.version, b.started_at,
           extract(epoch FROM clock_timestamp() - b.seen_at)::double precision,
           b.nats, b.listener, b.loops, b.held
    FROM arm.bridge_instance b
    WHERE b.seen_at >= clock_timestamp() - interval '1 day'
    ORDER BY b.seen_at DESC, b.name;
END
$$;
