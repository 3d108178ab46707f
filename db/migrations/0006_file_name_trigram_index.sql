-- The trigram index of the file list's q (arm.list_files in
-- db/functions/75_list_files.sql): a q that matches few names is found through this index
-- instead of walking the whole list, so a page costs about the same at 10,000 and at
-- 1,000,000 files (benchmarks/files.py, "q matching one name a batch").
--
-- pg_trgm is a contrib extension (Debian's postgresql-15 ships it) and a TRUSTED one: a
-- user with CREATE on the database may create it. It is created in schema public unless
-- the database has it already (wherever it is); the index names the operator class in
-- the extension's schema. Where it is not installed or not permitted, this migration
-- says so in a NOTICE and creates no index: arm.list_files then walks the list for every
-- q as before — the same answers, only a rare q costs a read of every name. Installing
-- pg_trgm later and running the DO block below again (as the owner) adds the index.
--
-- The index is on arm.fold_name(original_name), the folded name list_files searches with
-- LIKE (the built-in ~~ of pg_catalog, which gin_trgm_ops supports: no operator of the
-- extension is called, so the functions' pinned search_path needs nothing more). The
-- functions' files run after the migrations, so fold_name is defined here too, with the
-- body of db/functions/75_list_files.sql (tests/integration/test_list_files.py holds the
-- two equal; db/README.md). fold_name is IMMUTABLE, as an index expression must be; its
-- body must never change in place while this index exists (the index would keep the old
-- folding): a new folding is a new function and a new index.
--
-- The price: CREATE INDEX locks writes to stored_file while it builds (about 10 s per
-- million files), and each upload writes a GIN entry (fastupdate's pending list).
-- depends: 0005_file_list_indexes

CREATE OR REPLACE FUNCTION arm.fold_name(p_name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT pg_catalog.lower(pg_catalog.translate(p_name,
        'АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ',
        'абвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþαβγδεζηθικλμνξοπρστυφχψω')
        COLLATE "C")
$$;

DO $$
DECLARE
    v_schema text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_trgm') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions
                       WHERE name = 'pg_trgm') THEN
            RAISE NOTICE 'pg_trgm is not installed on this server: no trigram index for the '
                'file list''s q (a rare q reads every name; install postgresql-contrib to '
                'add it)';
            RETURN;
        END IF;
        BEGIN
            CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public;
        EXCEPTION WHEN OTHERS THEN
            RAISE NOTICE 'pg_trgm could not be created (%: %): no trigram index for the '
                'file list''s q (a rare q reads every name)', SQLSTATE, SQLERRM;
            RETURN;
        END;
    END IF;
    SELECT n.nspname INTO v_schema
    FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'pg_trgm';
    EXECUTE pg_catalog.format(
        'CREATE INDEX IF NOT EXISTS stored_file_name_trgm_idx ON arm.stored_file'
        ' USING gin (arm.fold_name(original_name) %I.gin_trgm_ops)', v_schema);
END;
$$;
