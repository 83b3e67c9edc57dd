-- What is wrong with a name (a workflow, step, queue or state field): 1 to
-- 255 bytes, no control characters, as validate::name says; NULL when
-- nothing is.
CREATE OR REPLACE FUNCTION name_problem(v text)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN v IS NULL OR v = '' THEN 'must not be empty'
                WHEN octet_length(v) > 255
                THEN format('is %s bytes long; the limit is 255', octet_length(v))
                WHEN v ~ '[[:cntrl:]]' THEN 'must not contain NUL or control characters'
           END
$$;
