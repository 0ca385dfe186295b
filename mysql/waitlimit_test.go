package mysql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
)

// waitLimit is the statement limit the operator-settings tests give
// their server's sessions.
const waitLimit = 300 * time.Millisecond

// The operator-settings conformance checks, under a lock wait limit of
// one second (innodb_lock_wait_timeout, 1205) and under MariaDB's
// statement limit (max_statement_time, 1969), each set for every session
// of the pool as an operator would set it for the server.
func TestOperatorSettings(t *testing.T) {
	for _, setting := range []struct {
		name, param string
		limit       time.Duration
	}{
		{"innodb_lock_wait_timeout", "innodb_lock_wait_timeout=1", time.Second},
		{"max_statement_time", "max_statement_time=0.3", waitLimit},
	} {
		t.Run(setting.name, func(t *testing.T) {
			db := testDB(t, setting.param)
			idemtest.RunOperator(t, idemtest.Operator{
				WaitLimited: func(t *testing.T) backend.Backend {
					b, _ := testBackend(t, db)
					return b
				},
				WaitLimit: setting.limit,
				RunOnceTx: func(ctx context.Context, s *idem.Store[string], key string, fn func(context.Context) (string, error)) (string, error) {
					return RunOnceTx(ctx, s, key, nil, func(ctx context.Context, _ *sql.Tx) (string, error) { return fn(ctx) })
				},
			})
		})
	}
}
