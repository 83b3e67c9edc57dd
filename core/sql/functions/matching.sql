-- The ids of the instances a filter names (engine/actions.rs, Filter), in id
-- order after `after` (NULL: from the first), at most `lim` (NULL: all).
-- Each condition applies when given: ids, workflow, queue, statuses,
-- concurrency key, and text in the message of the last error recorded.
CREATE OR REPLACE FUNCTION matching(ids bigint[], workflow text, queue text, statuses text[],
                                    concurrency_key text, error text, after bigint, lim integer)
RETURNS SETOF bigint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT i.id FROM instances i
    WHERE (matching.ids IS NULL OR i.id = ANY (matching.ids))
      AND (matching.workflow IS NULL OR i.workflow = matching.workflow)
      AND (matching.queue IS NULL OR i.queue = matching.queue)
      AND (matching.statuses IS NULL OR i.status = ANY (matching.statuses))
      AND (matching.concurrency_key IS NULL OR i.concurrency_key = matching.concurrency_key)
      AND (matching.error IS NULL
           OR strpos(lower(i.errors -> -1 ->> 'message'), lower(matching.error)) > 0)
      AND (matching.after IS NULL OR i.id > matching.after)
    ORDER BY i.id
    LIMIT lim
$$;
