-- Whether the engine's tables exist in the schema (nothing is created).
SELECT to_regclass('__S__.instances') IS NOT NULL
