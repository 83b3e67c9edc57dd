-- Whether rows of `wf` in queue `q` wait for no live node: some node that
-- heartbeated within `lease` seconds serves the queue, and none of those runs
-- the workflow. A node that records no workflows may run any.
CREATE OR REPLACE FUNCTION orphaned(q text, wf text, lease float8)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM nodes n
                   WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q)
       AND NOT EXISTS (SELECT 1 FROM nodes n
                       WHERE n.heartbeat_at > now() - make_interval(secs => lease) AND n.queues ? q
                         AND coalesce(n.workflows ? wf, true));
END
$$;
