-- The table idem's postgres backend keeps its records in, for teams that
-- manage schemas themselves (then pass Options.NoMigrate). postgres.New
-- creates the same table, with the name from Options.Table, if absent.
-- Upgrading a table made by an earlier version (New does this itself
-- unless NoMigrate, in one transaction; on a large table, run it yourself
-- first, the index CONCURRENTLY, outside a transaction):
--   ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS steps bytea;
--   ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS sweep_at timestamptz;
--   UPDATE idem_keys SET sweep_at = coalesce(expires_at, created_at) WHERE sweep_at IS NULL;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_keys_sweep ON idem_keys (sweep_at);
--   DROP INDEX CONCURRENTLY IF EXISTS idem_keys_expiry;
--   ALTER TABLE idem_keys SET (fillfactor = 90);
-- No index holds a column Complete writes, so a Complete can be a HOT
-- update; sweep_at, which the claim sets, is the earliest instant its
-- outcome can expire.
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
    steps       bytea,                             -- the steps the operation recorded (backend.AppendSteps)
    sweep_at    timestamptz                        -- the claim's instant plus the TTL: no sweep looks at the row before
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02); -- room for HOT updates; vacuum at 1% dead, not 20%
CREATE INDEX IF NOT EXISTS idem_keys_sweep ON idem_keys (sweep_at);
