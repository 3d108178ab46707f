-- Rolls back 0006: the trigram index of the file list's q.
SELECT 1;
