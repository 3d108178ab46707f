-- The group roles of arm-core (docs/dbas.md "Database roles"). Roles belong to the cluster, not
-- to a database: `arm-core migrate` runs this before the migrations whenever one of them
-- is missing, and a DBA runs it once, as a superuser or a role with CREATEROLE, where the
-- migrating user may not create roles (migrate then prints it and stops). Safe to run
-- again, and at the same time from migrates of other databases of the cluster.
--
-- None of them can log in. Login users are made members of the role of what they run:
--   CREATE ROLE bridge_login LOGIN PASSWORD '…' IN ROLE arm_bridge;
-- What each role may do in a database is granted by db/grants.sql on every migrate.
DO $roles$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT * FROM (VALUES
            ('arm_owner', 'arm-core: owns schema arm, its tables and functions; migrations only'),
            ('arm_bridge', 'arm-core: the functions the bridge calls (arm-core bridge, serve)'),
            ('arm_api', 'arm-core: what the HTTP API calls: retry, the file view and list, the status, the health check'),
            ('arm_uploader', 'arm-core: the upload of a file and its first job (a function or plain SQL)'),
            ('arm_readonly', 'arm-core: SELECT on the tables of schema arm (DBAs, dashboards)')
        ) AS v(name, description)
    LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r.name);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r.name);
            EXECUTE format('COMMENT ON ROLE %I IS %L', r.name, r.description);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- a migrate of another database of the cluster created it meanwhile
        END;
    END LOOP;
END;
$roles$;
