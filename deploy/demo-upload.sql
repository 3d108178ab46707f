-- The compose try-out's uploads (docs/containers.md "The whole stack: compose.yaml"), as
-- upstream sends them: one call of arm.upload_files, as upload_login. Four files: three
-- the reference services recognise, one whose name asks them to fail it ([fail]). Each
-- run uploads them again, under fresh keys.
SELECT u.n, u.file_id, u.job_id
FROM arm.upload_files((
    SELECT jsonb_agg(jsonb_build_object(
               'bucket', 'arm-ka',
               'key', 'uploads/demo/' || gen_random_uuid() || '/' || d.name,
               'original_name', d.name,
               'file_type', d.file_type,
               'created_by', 'compose try-out') ORDER BY d.n)
    FROM (VALUES (1, 'ОСВ 60 сентябрь 2026.xlsx', 'XLSX'),
                 (2, 'ОСВ 62 РБ 3 квартал.xls', 'XLS'),
                 (3, 'Акт сверки (скан).pdf', 'PDF'),
                 (4, 'ОСВ повреждённая [fail].xlsb', 'XLSB')) AS d(n, name, file_type)
)) AS u;
