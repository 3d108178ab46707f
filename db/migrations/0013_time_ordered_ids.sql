-- New files, objects and jobs get time-ordered ids (UUID version 7, RFC 9562: 48 bits of
-- Unix milliseconds, then random bits) instead of random ones (version 4). Every job
-- status change writes a new entry into each index of recognition_job (the status is in
-- the predicates of its partial indexes, so no change is a heap-only update), and a random
-- id puts that entry on a random leaf page of the primary key and of the unique
-- (file_id, attempt) and (id, file_id) indexes: the more history, the more of those pages
-- a publish, an ack or a sweep reads from outside the cache and writes whole into the WAL
-- after a checkpoint. Time-ordered ids keep the live jobs' entries on the few pages of the
-- newest ids, as a bigserial would, and keep the ids opaque uuids for the API and the
-- services. Ids already stored stay as they are; both kinds are valid uuids.
--
-- The functions' files run after the migrations, so uuid_v7 is defined here too, with the
-- body of db/functions/00_helpers.sql (tests/integration/test_schema.py holds the two
-- equal), which also says why it is PL/pgSQL.
-- depends: 0012_job_table_autovacuum

CREATE OR REPLACE FUNCTION arm.uuid_v7()
RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
BEGIN
    RETURN pg_catalog.encode(
        pg_catalog.set_bit(pg_catalog.set_bit(
            pg_catalog.overlay(
                pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
                pg_catalog.substr(pg_catalog.int8send(pg_catalog.floor(
                    pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000
                )::pg_catalog.int8), 3),
                1, 6),
            52, 1), 53, 1),
        'hex')::pg_catalog.uuid;
END
$$;

ALTER TABLE arm.s3_object ALTER COLUMN id SET DEFAULT arm.uuid_v7();
ALTER TABLE arm.stored_file ALTER COLUMN id SET DEFAULT arm.uuid_v7();
ALTER TABLE arm.recognition_job ALTER COLUMN id SET DEFAULT arm.uuid_v7();
