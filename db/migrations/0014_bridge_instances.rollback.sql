-- Rolls back 0014: the bridges' rows and their functions. (The release rolled back to
-- shows only the bridge of the process serving the console.)
DROP FUNCTION IF EXISTS arm.record_bridge(text, text, timestamptz, text, text, jsonb, integer);
DROP FUNCTION IF EXISTS arm.forget_bridge(text);
DROP FUNCTION IF EXISTS arm.bridge_instances();
DROP TABLE IF EXISTS arm.bridge_instance;
