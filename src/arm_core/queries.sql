-- Every query the Python side sends, by name (loaded once by arm_core.db).
-- Each one that reads or changes the state calls a function of db/functions (the
-- database owns every state change); `answers` reads nothing, it only asks the server for
-- a row (the probes of the database's health).
-- A name says what the query does, not which version of a function it calls: when a
-- function gets a new version (db/README.md), its query calls the new one under the
-- same name (retry_file calls arm.retry_file_v3).

-- name: dead_letter_unacked
SELECT job_id, attempt, file_id, republish_count
FROM arm.dead_letter_unacked(make_interval(secs => %(ack_timeout)s), %(max_republish)s);

-- name: claim_unacked_jobs
-- bytes: what the server counts against max_payload for the request (arm.nats_message_bytes,
-- the rule publish_queued_jobs_v2 dead-letters by).
SELECT job_id, attempt, subject, msg_id, republish_count, request,
       arm.nats_message_bytes(request::text, msg_id) AS bytes
FROM arm.claim_unacked_jobs(%(limit)s, make_interval(secs => %(ack_timeout)s),
                            %(max_republish)s);

-- name: outbox_ready_age
SELECT arm.outbox_ready_age() AS age;

-- name: answers
SELECT true AS answers;

-- name: mark_republished
SELECT arm.mark_republished(%(job_ids)s::uuid[]) AS marked;

-- name: dead_letter_unrepublishable
SELECT job_id, attempt, file_id
FROM arm.dead_letter_unrepublishable(%(job_ids)s::uuid[], %(error_codes)s::text[],
                                     %(error_messages)s::text[]);

-- name: run_due_tasks
SELECT task, result, error FROM arm.run_due_tasks();

-- name: set_sweep_interval
SELECT arm.set_sweep_interval(make_interval(secs => %(seconds)s));

-- name: record_bridge
SELECT arm.record_bridge(%(name)s, %(version)s, %(started_at)s, %(nats)s, %(listener)s,
                         %(loops)s, %(held)s);

-- name: forget_bridge
SELECT arm.forget_bridge(%(name)s) AS forgotten;

-- name: bridge_instances
SELECT name, version, started_at, seen_seconds_ago, nats, listener, loops, held
FROM arm.bridge_instances();

-- name: set_setting
SELECT arm.set_setting(%(name)s, %(value)s);

-- name: retry_file
SELECT file_id, outcome, reason, job_id, attempt, previous_job_id,
       previous_status::text AS previous_status, previous_attempt, max_attempts
FROM arm.retry_file_v3(%(file_id)s, %(actor)s, %(expected_job_id)s, %(actor_level)s);

-- name: retry_files
SELECT file_id, outcome, reason, job_id, attempt, previous_job_id,
       previous_status::text AS previous_status, previous_attempt, max_attempts
FROM arm.retry_files_v3(%(file_ids)s::uuid[], %(actor)s, %(expected_job_ids)s::uuid[],
                        %(actor_level)s);

-- name: get_file
SELECT arm.get_file(%(file_id)s) AS file;

-- name: publish_queued_jobs
SELECT job_id, attempt, file_id, outcome, subject, msg_id, request, error_message,
       queued_seconds
FROM arm.publish_queued_jobs_v2(%(limit)s, make_interval(secs => %(tabular_timeout)s),
                                make_interval(secs => %(image_timeout)s),
                                %(tabular_subject)s, %(image_subject)s, %(max_bytes)s);

-- name: publish_paced_jobs
SELECT job_id, attempt, file_id, outcome, subject, msg_id, request, error_message,
       queued_seconds, probe
FROM arm.publish_queued_jobs_v3(%(limit)s, make_interval(secs => %(tabular_timeout)s),
                                make_interval(secs => %(image_timeout)s),
                                %(tabular_subject)s, %(image_subject)s, %(max_bytes)s,
                                %(pacing)s, %(tabular_min)s, %(tabular_max)s,
                                %(image_min)s, %(image_max)s,
                                make_interval(secs => %(ack_timeout)s), %(max_republish)s);

-- name: pace_unheard
SELECT arm.pace_unheard(%(pipeline)s::arm.pipeline, %(retry_seconds)s);

-- name: pace_view
SELECT pipeline::text AS pipeline, mode, in_flight_limit, pinned, in_flight, queued,
       held_back, answering, silent_since, latency_seconds, min_latency_seconds,
       answers_per_second
FROM arm.pace_view();

-- name: apply_envelopes
SELECT ord, outcome, attempt, status::text AS status, wait_seconds
FROM arm.apply_envelopes_v2(%(envelopes)s::jsonb) ORDER BY ord;

-- name: compact_counts
SELECT arm.compact_counts() AS folded;

-- name: status_view
SELECT jobs, files, oldest_queued_age_seconds, unacked_overdue, past_deadline_unswept,
       last_sweep_at, last_sweep_result, last_sweep_error
FROM arm.status_view(make_interval(secs => %(ack_timeout)s));

-- name: record_waits
SELECT arm.record_waits(%(phase)s, %(counts)s::bigint[]);

-- name: status_series
SELECT sampled_at, seconds, finished, queued, oldest_queued_age_seconds, waits
FROM arm.status_series(%(minutes)s);

-- name: list_files
SELECT id, consolidation_id, original_name, file_type::text AS file_type,
       status::text AS status, s3_bucket, s3_key, created_at, updated_at,
       job_id, job_status::text AS job_status, attempt, max_attempts, error_code, retryable
FROM arm.list_files(
    p_limit => %(limit)s,
    p_after_created_at => %(after_created_at)s, p_after_id => %(after_id)s,
    p_statuses => %(statuses)s::arm.file_status[],
    p_job_statuses => %(job_statuses)s::arm.job_status[],
    p_consolidation_id => %(consolidation_id)s,
    p_file_types => %(file_types)s::arm.file_type[],
    p_q => %(q)s,
    p_updated_after => %(updated_after)s, p_updated_before => %(updated_before)s);
