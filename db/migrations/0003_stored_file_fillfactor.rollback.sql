-- Rolls back 0003: the default fillfactor.
ALTER TABLE arm.stored_file RESET (fillfactor);
