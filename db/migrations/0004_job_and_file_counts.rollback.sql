-- Rolls back 0004 (skeleton).
SELECT 1;
