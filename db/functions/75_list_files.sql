-- The file list of the API and the operator console, GET /api/v1/files.
-- Read-only. list_files is SECURITY DEFINER, executable by arm_api and arm_readonly
-- (db/grants.sql); fold_name, name_pattern and is_retryable are read-only helpers: PUBLIC,
-- no SET clause (so the SQL ones inline), the caller's rights.

-- A name folded for a case-insensitive search, the same in every database whatever its
-- locale: lower() under COLLATE "C" folds ASCII only (in a C-locale database, or any
-- libc C collation, lower('ДОГОВОР') stays 'ДОГОВОР' on PostgreSQL 15), so the upper-case
-- letters of Cyrillic (Russian, Ukrainian, Belarusian, Serbian, Macedonian), Latin-1 and
-- Greek are mapped explicitly. ICU collations and pg_trgm are not assumed to exist.
CREATE OR REPLACE FUNCTION arm.fold_name(p_name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT pg_catalog.lower(pg_catalog.translate(p_name,
        'АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ',
        'абвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþαβγδεζηθικλμνξοπρστυφχψω')
        COLLATE "C")
$$;

-- The regular expression that finds p_q in a name the way
-- strpos(arm.fold_name(name), arm.fold_name(p_q)) > 0 does, for `name COLLATE "C" ~ it`:
-- every letter of p_q becomes the class of the letters fold_name folds alike ([оО], [aA]),
-- every other character is escaped (under COLLATE "C" a backslash before any character but
-- an ASCII letter or digit is that character). Built once per call; matching it costs a
-- tenth of folding every name (benchmarks/files.py), and needs no index, ICU or pg_trgm.
CREATE OR REPLACE FUNCTION arm.name_pattern(p_q text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT coalesce(string_agg(
        CASE WHEN x.low <> x.up THEN '[' || x.low || x.up || ']'
             WHEN x.c COLLATE "C" ~ '^[0-9A-Za-z]$' THEN x.c
             ELSE E'\\' || x.c END, '' ORDER BY x.i), '')
    FROM (SELECT s.i, s.c, arm.fold_name(s.c) AS low,
                 pg_catalog.upper(pg_catalog.translate(arm.fold_name(s.c),
                     'абвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþαβγδεζηθικλμνξοπρστυφχψω',
                     'АБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ')
                     COLLATE "C") AS up
          FROM pg_catalog.regexp_split_to_table(p_q, '') WITH ORDINALITY AS s(c, i)) x
$$;

-- Whether a file whose current job is (status, attempt, max_attempts) can be retried:
-- the rule arm.retry_file applies (db/functions/50_retry.sql: the job failed — error,
-- timeout, dlq — and attempt < max_attempts). tests/integration/test_list_files.py
-- checks the two agree for every status.
CREATE OR REPLACE FUNCTION arm.is_retryable(
    p_status arm.job_status, p_attempt integer, p_max_attempts integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(p_status IN ('error', 'timeout', 'dlq') AND p_attempt < p_max_attempts,
                    false)
$$;

-- One page of files, newest first (created_at DESC, id DESC), after the keyset
-- (p_after_created_at, p_after_id) when given. Every filter is optional (NULL = any);
-- the arrays match any of their values. p_q is a substring of original_name, compared
-- after fold_name (through name_pattern). p_updated_after / p_updated_before are exclusive bounds.
--
-- Cost: the statement is built from the filters present (EXECUTE … USING, so each call
-- is planned with its own values and no filter costs a "$n IS NULL OR" the planner cannot
-- see through), and it never sorts the matching rows: without a status filter it walks
-- stored_file_created_idx from the keyset and stops at p_limit; with one, ERROR walks
-- its partial index and the other statuses walk stored_file_created_idx, filtered (at
-- most p_limit rows each), and the two are merged.
-- The page's object and current job are primary-key lookups per file, never joins of
-- whole tables (tests/integration/test_list_files.py reads the plans).
-- The other filters are applied along the walk, so their cost is the rows walked past
-- until p_limit match: constant for a common value, up to the table for a rare one
-- (docs/operators.md "The file list"). A consolidation_id filter uses stored_file_consolidation_idx.
--
-- A q of 3 characters or more, with a run of 3 letters or digits (what pg_trgm makes
-- trigrams of), when the trigram index of migration 0006 exists, picks its strategy per
-- call: it first collects the ids of the names that match, through that index
-- (fold_name(name) LIKE '%' || fold_name(q) || '%', % _ \ escaped), stopping after
-- Q_CAP + 1. Up to Q_CAP (200) matches, the page is those rows — the other filters
-- and the keyset applied, sorted, limited: a cost that follows the matches, not the
-- table. More than Q_CAP: the walk above, as without the index — soon done when the
-- matches are dense; between Q_CAP and a page's worth per few thousand files it still
-- reads about limit × files / matches rows (docs/operators.md "The file list"). Both give the same rows (the LIKE over
-- fold_name is the definition name_pattern implements; tests/integration/
-- test_list_files.py compares the strategies page by page). The setting
-- arm.list_files_q_cap (digits) overrides Q_CAP for the session: tests force either
-- strategy with it.
CREATE OR REPLACE FUNCTION arm.list_files(
    p_limit integer,
    p_after_created_at timestamptz DEFAULT NULL,
    p_after_id uuid DEFAULT NULL,
    p_statuses arm.file_status[] DEFAULT NULL,
    p_job_statuses arm.job_status[] DEFAULT NULL,
    p_consolidation_id uuid DEFAULT NULL,
    p_file_types arm.file_type[] DEFAULT NULL,
    p_q text DEFAULT NULL,
    p_updated_after timestamptz DEFAULT NULL,
    p_updated_before timestamptz DEFAULT NULL
)
RETURNS TABLE (
    id uuid,
    consolidation_id uuid,
    original_name text,
    file_type arm.file_type,
    status arm.file_status,
    s3_bucket text,
    s3_key text,
    created_at timestamptz,
    updated_at timestamptz,
    job_id uuid,
    job_status arm.job_status,
    attempt integer,
    max_attempts integer,
    error_code text,
    retryable boolean
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, arm, pg_temp
AS $$
DECLARE
    v_where text := '';
    v_page text;
    v_cap integer := 200;  -- Q_CAP
    v_matches uuid[];
    v_folded text;
    v_others arm.file_status[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1001 THEN
        RAISE EXCEPTION 'list_files: p_limit must be 1..1001, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_after_created_at IS NULL) <> (p_after_id IS NULL) THEN
        RAISE EXCEPTION 'list_files: the keyset needs both p_after_created_at and p_after_id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF p_after_created_at IS NOT NULL THEN
        v_where := v_where || ' AND (f.created_at, f.id) < ($1, $2)';
    END IF;
    IF p_job_statuses IS NOT NULL THEN
        -- A subquery per row walked (the job's primary key), never a join the planner
        -- could turn into a hash of every job.
        v_where := v_where || ' AND (SELECT cj.status FROM arm.recognition_job cj'
            || ' WHERE cj.id = f.current_recognition_job_id) = ANY ($4)';
    END IF;
    IF p_consolidation_id IS NOT NULL THEN
        v_where := v_where || ' AND f.consolidation_id = $5';
    END IF;
    IF p_file_types IS NOT NULL THEN
        v_where := v_where || ' AND f.file_type = ANY ($6)';
    END IF;
    IF p_updated_after IS NOT NULL THEN
        v_where := v_where || ' AND f.updated_at > $8';
    END IF;
    IF p_updated_before IS NOT NULL THEN
        v_where := v_where || ' AND f.updated_at < $9';
    END IF;

    -- q: the ids of its matches through the trigram index when they are few (the header).
    v_folded := arm.fold_name(p_q);
    IF pg_catalog.length(v_folded) >= 3 AND v_folded ~ '[[:alnum:]]{3}'
       AND pg_catalog.to_regclass('arm.stored_file_name_trgm_idx') IS NOT NULL THEN
        IF pg_catalog.current_setting('arm.list_files_q_cap', true) ~ '^[0-9]{1,9}$' THEN
            v_cap := pg_catalog.current_setting('arm.list_files_q_cap', true)::integer;
        END IF;
        -- EXECUTE: planned with this q's pattern (a generic plan could not estimate it).
        -- The regular expression finds the same names (the header) and costs a twentieth
        -- of folding one: where the planner reads the table instead (q common), a name
        -- is folded only when it matches.
        EXECUTE 'SELECT array_agg(m.id) FROM (SELECT f.id FROM arm.stored_file f'
            || ' WHERE arm.fold_name(f.original_name) LIKE $1'
            || ' AND f.original_name COLLATE "C" ~ $3 LIMIT $2) m'
        INTO v_matches
        USING '%' || pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                  v_folded, E'\\', E'\\\\'), '%', E'\\%'), '_', E'\\_') || '%',
              v_cap + 1, arm.name_pattern(p_q);
        IF coalesce(pg_catalog.cardinality(v_matches), 0) > v_cap THEN
            v_matches := NULL;
        ELSE
            v_matches := coalesce(v_matches, '{}');
        END IF;
    END IF;
    IF p_q IS NOT NULL AND v_matches IS NULL THEN
        v_where := v_where || ' AND f.original_name COLLATE "C" ~ $7';
    END IF;

    IF v_matches IS NOT NULL THEN
        -- The few matches by primary key, filtered, sorted, limited.
        v_page := 'SELECT f.* FROM arm.stored_file f WHERE f.id = ANY ($11)'
            || CASE WHEN p_statuses IS NULL THEN '' ELSE ' AND f.status = ANY ($3)' END
            || v_where || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10';
    ELSIF p_statuses IS NULL THEN
        v_page := 'SELECT f.* FROM arm.stored_file f WHERE true' || v_where
            || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10';
    ELSE
        -- ERROR, the rare one: its partial index (stored_file_failed_created_idx, on the
        -- generated `failed`: migration 0008), walked from its newest entry. The others
        -- (PROCESSING is most files, UPLOADED the newest ones): the walk of
        -- stored_file_created_idx, filtered. Each stops at p_limit; then the merge.
        v_others := ARRAY(SELECT DISTINCT s FROM unnest(p_statuses) s WHERE s <> 'ERROR');
        v_page := 'SELECT p.* FROM ('
            || CASE WHEN 'ERROR' = ANY (p_statuses) THEN
                   '(SELECT f.* FROM arm.stored_file f WHERE f.failed' || v_where
                   || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10)'
               ELSE '' END
            || CASE WHEN 'ERROR' = ANY (p_statuses) AND cardinality(v_others) > 0
                    THEN ' UNION ALL ' ELSE '' END
            || CASE WHEN cardinality(v_others) > 0 THEN
                   '(SELECT f.* FROM arm.stored_file f WHERE f.status = ANY ($12)' || v_where
                   || ' ORDER BY f.created_at DESC, f.id DESC LIMIT $10)'
               ELSE '' END
            || ') p ORDER BY p.created_at DESC, p.id DESC LIMIT $10';
    END IF;

    RETURN QUERY EXECUTE
        'SELECT f.id, f.consolidation_id, f.original_name, f.file_type, f.status,'
        || ' o.bucket, o.key, f.created_at, f.updated_at,'
        || ' j.id, j.status, j.attempt, j.max_attempts, j.error_code,'
        || ' arm.is_retryable(j.status, j.attempt, j.max_attempts)'
        || ' FROM (' || v_page || ') f'
        -- LATERAL … LIMIT 1: one primary-key lookup per file of the page (a plain join
        -- may be planned as a hash of the whole table).
        || ' CROSS JOIN LATERAL (SELECT o.bucket, o.key FROM arm.s3_object o'
        || ' WHERE o.id = f.s3_object_id LIMIT 1) o'
        || ' LEFT JOIN LATERAL (SELECT j.id, j.status, j.attempt, j.max_attempts, j.error_code'
        || ' FROM arm.recognition_job j WHERE j.id = f.current_recognition_job_id LIMIT 1) j'
        || ' ON true'
        || ' ORDER BY f.created_at DESC, f.id DESC'
    USING p_after_created_at, p_after_id, p_statuses, p_job_statuses, p_consolidation_id,
          p_file_types, arm.name_pattern(p_q), p_updated_after, p_updated_before, p_limit,
          v_matches, v_others;
END;
$$;
