-- The table idem's postgres backend keeps its records in, for teams that
-- manage schemas themselves (then pass Options.NoMigrate). postgres.New
-- creates the same table, with the name from Options.Table, if absent.
-- Upgrading a table made by an earlier version (New does this itself
-- unless NoMigrate, in one transaction, whose CREATE INDEX blocks writes
-- while it builds; on a large table, run these yourself first, the index
-- CONCURRENTLY, outside a transaction):
--   ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS steps bytea;
--   ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS sweep_at timestamptz;
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idem_keys_sweep ON idem_keys (sweep_at);
--   DROP INDEX CONCURRENTLY IF EXISTS idem_keys_expiry;
--   ALTER TABLE idem_keys SET (fillfactor = 90);
-- The rows already there need no UPDATE: sweeps give them their sweep_at
-- a batch at a time. While replicas of an earlier version still run, their
-- claims leave sweep_at unset (the sweeps find those too), and their own
-- sweeps, without idem_keys_expiry, read the whole table: stop their
-- sweepers (Options.SweepInterval < 0) or keep the rollout short.
-- No index holds a column Complete writes, so a Complete can be a HOT
-- update; sweep_at, which the claim sets and Complete lowers only for a
-- TTL shorter than the claim assumed, is no later than the outcome's expiry.
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
    sweep_at    timestamptz                        -- the claim's instant plus the TTL, at most the expiry: when a sweep looks
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02); -- room for HOT updates; vacuum at 1% dead, not 20%
CREATE INDEX IF NOT EXISTS idem_keys_sweep ON idem_keys (sweep_at);
