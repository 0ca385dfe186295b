-- The table idem's postgres backend keeps its records in, for teams that
-- manage schemas themselves (then pass Options.NoMigrate). postgres.New
-- creates the same table, with the name from Options.Table, if absent.
-- A table made before steps were recorded needs their column:
--   ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS steps bytea;
CREATE TABLE IF NOT EXISTS idem_keys (
    key         text        PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    token       text        NOT NULL,
    state       smallint    NOT NULL,              -- 1 pending, 2 completed, 3 interrupted
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,                       -- completed: when the outcome may be forgotten
    lease_until timestamptz,                       -- pending: until when the owner's claim holds
    value       bytea,                             -- completed: the encoded result
    failed      boolean     NOT NULL DEFAULT false, -- completed with a final error
    err_msg     text        NOT NULL DEFAULT '',
    steps       bytea                              -- the steps the operation recorded (backend.AppendSteps)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02); -- vacuum at 1% dead, not 20%
CREATE INDEX IF NOT EXISTS idem_keys_expiry ON idem_keys (expires_at) WHERE state = 2;
