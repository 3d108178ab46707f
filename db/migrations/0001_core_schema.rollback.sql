-- Rolls back 0001: the whole arm schema, with the functions and triggers that
-- db/functions put into it (they are re-created by the next migrate).
DROP SCHEMA IF EXISTS arm CASCADE;
