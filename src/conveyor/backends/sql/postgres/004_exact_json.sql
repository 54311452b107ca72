-- Arguments, results and step results keep the JSON text as written: json, not jsonb. jsonb
-- stores numbers as numeric and prints them back normalized (the float 4.15369378901283e+16
-- came back as the integer 41536937890128300, 1e308 as 309 digits), so a task saw other values
-- than it was given on SQLite and Redis. Nothing queries inside these columns: the store only
-- writes and returns them (errors and meta, which it does edit, stay jsonb).
-- Changing the type rewrites conveyor_jobs under an exclusive lock: on a large table, run this
-- migration in a quiet moment. Values already stored keep their normalized text.
ALTER TABLE conveyor_jobs
    ALTER COLUMN args DROP DEFAULT,
    ALTER COLUMN args TYPE json USING args::json,
    ALTER COLUMN args SET DEFAULT '{}',
    ALTER COLUMN result TYPE json USING result::json;

ALTER TABLE conveyor_steps ALTER COLUMN result TYPE json USING result::json;
