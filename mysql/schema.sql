-- The table idem's mysql backend keeps its records in, for teams that
-- manage schemas themselves (then pass Options.NoMigrate). mysql.New
-- creates the same table, with the name from Options.Table, if absent.
-- Keys and tokens are bytes (VARBINARY): only identical bytes are one key,
-- whatever the server's collation, which would fold case ("Order-1" and
-- "order-1") and, for PAD SPACE collations, trailing spaces.
-- Instants are UTC, from UTC_TIMESTAMP(6), whatever the session's time_zone.
CREATE TABLE IF NOT EXISTS `idem_keys` (
    `key`       VARBINARY(255) NOT NULL,
    fingerprint BINARY(32)     NOT NULL,
    token       VARBINARY(255) NOT NULL,
    state       TINYINT        NOT NULL,       -- 1 pending, 2 completed, 3 interrupted
    created_at  DATETIME(6)    NOT NULL,
    expires_at  DATETIME(6)    NULL,           -- completed: when the outcome may be forgotten
    lease_until DATETIME(6)    NULL,           -- pending: until when the owner's claim holds
    value       LONGBLOB       NULL,           -- completed: the encoded result
    failed      BOOLEAN        NOT NULL,       -- completed with a final error
    err_msg     LONGBLOB       NOT NULL,
    steps       LONGBLOB       NULL,           -- the steps the operation recorded (backend.AppendSteps)
    PRIMARY KEY (`key`),
    INDEX sweep (expires_at)                   -- the sweep's: completed records, oldest expiry first
) ENGINE = InnoDB;
