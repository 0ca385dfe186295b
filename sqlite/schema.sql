-- The table a sqlite.Backend keeps its records in (New creates it unless
-- Options.NoMigrate). Instants are Unix nanoseconds by the Store's clock.
CREATE TABLE IF NOT EXISTS idem_keys (
    key         TEXT    PRIMARY KEY NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       TEXT    NOT NULL,
    state       INTEGER NOT NULL, -- 1 pending, 2 completed, 3 interrupted
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,          -- completed records only
    lease_until INTEGER,          -- pending records with a lease only
    value       BLOB,
    failed      INTEGER NOT NULL DEFAULT 0,
    err_msg     TEXT    NOT NULL DEFAULT '',
    steps       BLOB              -- the steps the operation recorded (backend.AppendSteps)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_keys_expiry ON idem_keys (expires_at) WHERE state = 2;
