-- arm.apply_ack and arm.apply_result, the inbox's single steps, and arm.claim_queued_jobs
-- and arm.mark_published, the publisher's two steps: the release before the previous
-- one (0.1.0) called them; 1.0.0 calls arm.apply_envelopes_v2 and
-- arm.publish_queued_jobs_v2 instead (tests/fixtures/previous_release), and so does this
-- release. No DBA interface names them (docs/dbas.md). Nothing else refers to them: no
-- function, trigger or arm.periodic_task row (a task calls its function without
-- arguments, and each of these takes some).
-- depends: 0016_pacing

DROP FUNCTION IF EXISTS arm.apply_ack(uuid, uuid, text, text);
DROP FUNCTION IF EXISTS arm.apply_result(uuid, uuid, text, arm.job_status, text, text, text,
    text, text, text, text, jsonb);
DROP FUNCTION IF EXISTS arm.claim_queued_jobs(integer, interval, interval);
DROP FUNCTION IF EXISTS arm.mark_published(uuid[], text[], timestamptz[]);
