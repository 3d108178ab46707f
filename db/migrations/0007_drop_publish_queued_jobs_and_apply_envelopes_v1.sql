-- arm.publish_queued_jobs and arm.apply_envelopes, the first versions of the publisher's
-- and the inbox's statements: arm.publish_queued_jobs_v2 and arm.apply_envelopes_v2 no
-- longer wrap them but do the work themselves (their own UPDATEs RETURN the waits they
-- add), and no release calls them — the previous release had neither
-- (tests/fixtures/previous_release), this one calls the _v2 names. Nothing else refers to
-- them: no function, trigger or arm.periodic_task row.
-- depends: 0006_file_name_trigram_index

DROP FUNCTION IF EXISTS arm.publish_queued_jobs(integer, interval, interval, text, text, integer);
DROP FUNCTION IF EXISTS arm.apply_envelopes(jsonb);
