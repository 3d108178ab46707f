-- The retry audit records, beside the actor, the access level it retried with: the API's
-- credentials carry levels now (src/arm_core/access.py), and the audit should say with
-- what rights a retry was made, not only by whom. `operator` for a credential of that
-- level; `all` for one that holds every level (a token without a level, AUTH_MODE=none,
-- AUTH_MODE=header without a groups header: what every caller held before levels).
-- arm.retry_file_v3 and arm.retry_files_v3 write it. NULL for a retry made through the
-- older names (arm.retry_file, arm.retry_file_v2: a DBA's SQL, or the previous release's
-- API) and for every retry recorded before this migration: nobody knows their level, and
-- guessing one would make the audit say what did not happen.
--
-- The archive keeps the columns of its hot table (arm.archive_files moves the audit rows
-- into it; a test holds the two column lists equal), so the column is added to both, last
-- in each, with the same check.
--
-- A nullable column without a default changes only the catalog (no rewrite). The checks
-- are NOT VALID so that adding them does not scan the tables under the ALTER's lock: every
-- existing row has the new column NULL, which passes, and new and updated rows are
-- checked either way (a DBA may VALIDATE them at any time; it cannot fail).
-- depends: 0014_bridge_instances

ALTER TABLE arm.retry_audit
    ADD COLUMN actor_level text,
    ADD CONSTRAINT retry_audit_actor_level CHECK (actor_level IN ('operator', 'all')) NOT VALID;

ALTER TABLE arm.archived_retry_audit
    ADD COLUMN actor_level text,
    ADD CONSTRAINT archived_retry_audit_actor_level CHECK (actor_level IN ('operator', 'all'))
        NOT VALID;
