-- Rolls back 0013: new ids are random (version 4) again. Ids already drawn stay.
ALTER TABLE arm.recognition_job ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE arm.stored_file ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE arm.s3_object ALTER COLUMN id SET DEFAULT gen_random_uuid();
DROP FUNCTION IF EXISTS arm.uuid_v7();
