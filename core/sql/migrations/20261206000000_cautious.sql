-- A successor starts on its node before the call that promotes it commits
-- (its turnover would otherwise wait for that call's round trip). Until then
-- the database has not counted its attempt: a step that kills its process
-- there would be given back uncounted, and could do it again forever. The
-- reaper marks every reserved row it takes back from a node that ended or
-- was presumed dead `cautious`, and a cautious row is never reserved as a
-- successor again: it starts only once claimed (its attempt counted), so its
-- next crash counts. Cleared when the row moves on to another step.
-- A constant default: no table rewrite.
ALTER TABLE instances ADD COLUMN IF NOT EXISTS cautious boolean NOT NULL DEFAULT false;
