-- Room on every stored_file page for the row's next version (the throughput rework).
-- A file's status changes after its upload (PROCESSING on the ack, ERROR or PROCESSING on
-- the result, ERROR on a timeout) and none of its indexes covers `status` or
-- `updated_at`: with free space on the page these updates are HOT — no new entry in the
-- three indexes of the table. At the default fillfactor (100) the pages of a burst of
-- uploads are full, and every status change wrote three index entries. Applies to pages
-- written from now on; `VACUUM FULL arm.stored_file` rewrites old ones if wanted.
-- recognition_job gains nothing from this: `status` sits in its partial indexes'
-- predicates, so its updates can never be HOT.
-- depends: 0002_unpublishable_dlq_bounds_scan_indexes

ALTER TABLE arm.stored_file SET (fillfactor = 70);
