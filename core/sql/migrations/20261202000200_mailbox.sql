-- Durable signals: a signal sent to an instance that is not awaiting is
-- kept here until it awaits that signal; one sent by name with a time to
-- live, that woke nobody, is kept for the first instance that awaits it
-- before it expires. The handoff delivers them (sql/functions/handoff.sql);
-- each is deleted as it is delivered, so it is delivered once.
CREATE TABLE mailbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The instance it was sent to; NULL: sent by name.
    instance   bigint,
    name       text        NOT NULL,
    payload    jsonb       NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    -- When a signal sent by name stops being kept.
    expires_at timestamptz,
    CONSTRAINT mailbox_named_expires CHECK (instance IS NOT NULL OR expires_at IS NOT NULL)
);

-- An instance's signals of one name, oldest first; signals by name likewise.
CREATE INDEX mailbox_instance ON mailbox (instance, name, id) WHERE instance IS NOT NULL;
CREATE INDEX mailbox_named ON mailbox (name, id) WHERE instance IS NULL;
