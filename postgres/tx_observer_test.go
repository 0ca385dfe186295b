package postgres_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
)

// A RunOnceTx that replays another process's committed outcome (fn does
// not run) is reported to the Observer as "replayed", not as "executed"
// with Executing +1/-1; a mismatch found in the table as "mismatch".
func TestRunOnceTxReplayIsObservedAsReplayed(t *testing.T) {
	dsn := svctest.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table := "idem_rv11_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	b, err := postgres.New(ctx, pool, postgres.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var outcomes []idem.Outcome
	execs := 0
	obs := &idem.Observer{
		Call: func(_ context.Context, _ string, o idem.Outcome, _ time.Duration) {
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		},
		Executing: func(_ context.Context, d int) { mu.Lock(); execs += max(d, 0); mu.Unlock() },
	}
	first := idem.New[string](idem.Options{Backend: b, SweepInterval: -1})
	defer first.Close()
	second := idem.New[string](idem.Options{Backend: b, SweepInterval: -1, Observer: obs}) // another process
	defer second.Close()
	fn := func(ctx context.Context, tx pgx.Tx) (string, error) { return "charged", nil }
	if _, err := postgres.RunOnceTx(ctx, first, "charge-1", nil, fn); err != nil {
		t.Fatal(err)
	}
	ran := false
	v, err := postgres.RunOnceTx(ctx, second, "charge-1", nil, func(ctx context.Context, tx pgx.Tx) (string, error) {
		ran = true
		return "again", nil
	})
	t.Logf("second: %q %v ran=%v outcomes=%v executions=%d", v, err, ran, outcomes, execs)
	if !ran && (len(outcomes) != 1 || outcomes[0] != idem.OutcomeReplayed) {
		t.Fatalf("a replay from the table was observed as %v (executions +%d), want [replayed]", outcomes, execs)
	}
	// A mismatch found in the table:
	outcomes = nil
	_, err = postgres.RunOnceTx(ctx, second, "charge-1", "other payload", fn)
	t.Logf("mismatch: %v outcomes=%v", err, outcomes)
	if len(outcomes) != 1 || outcomes[0] != idem.OutcomeMismatch {
		t.Errorf("ErrPayloadMismatch from the table observed as %v, want [mismatch]", outcomes)
	}
}
