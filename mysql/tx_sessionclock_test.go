package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// setClock is what fn sends to move its session's clock by d: SET
// timestamp, which NOW() and UTC_TIMESTAMP() follow for the rest of the
// session (SYSDATE() does not, on a server without --sysdate-is-now).
func setClock(ctx context.Context, tx *sql.Tx, d time.Duration) error {
	_, err := tx.ExecContext(ctx, `SET timestamp = ?`, float64(time.Now().Add(d).UnixMicro())/1e6)
	return err
}

// idemtest's session-clock check, on both shapes of the claim.
func TestRunOnceTxSessionClock(t *testing.T) {
	db := testDB(t)
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			idemtest.RunSessionClock(t, idemtest.SessionClockHarness{
				Backend: func(t *testing.T) backend.Backend {
					b, _ := testBackend(t, db)
					shape.apply(b)
					return b
				},
				RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func(time.Duration) error) (int, error)) (int, error) {
					return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx *sql.Tx) (int, error) {
						return fn(ctx, func(d time.Duration) error { return setClock(ctx, tx, d) })
					})
				},
			})
		})
	}
}

// A fn that sets its session's clock to the event it handles, three days
// old (so that NOW() in its inserts and triggers says when the event
// happened), records an outcome that expires a TTL after the server's
// real now, not a TTL after the event, which would be expired already:
// the next call replays it.
func TestRunOnceTxExpiryIgnoresSessionTimestamp(t *testing.T) {
	db := testDB(t)
	b, table := testBackend(t, db)
	name := moves(t, db, table)
	s := idem.New[int](idem.Options{Backend: b, TTL: 24 * time.Hour})
	defer s.Close()
	ctx := context.Background()
	event := time.Now().Add(-72 * time.Hour)
	handle := func(ctx context.Context, tx *sql.Tx) (int, error) {
		if _, err := tx.ExecContext(ctx, `SET timestamp = ?, time_zone = '+13:00'`, float64(event.UnixMicro())/1e6); err != nil {
			return 0, err
		}
		res, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES ('charged')")
		if err != nil {
			return 0, err
		}
		id, err := res.LastInsertId()
		return int(id), err
	}
	first, err := RunOnceTx(ctx, s, "event-1", "p", handle)
	require.NoError(t, err)

	var now int64
	require.NoError(t, db.QueryRow(`SELECT `+since+serverNow+`)`).Scan(&now))
	rec, found, err := b.Get(ctx, "event-1", time.Time{})
	require.NoError(t, err)
	require.True(t, found, "the outcome is remembered, not expired at once")
	assert.WithinDuration(t, time.UnixMicro(now).Add(24*time.Hour), rec.ExpiresAt, time.Minute, "expiry from the server's real now")

	again, err := RunOnceTx(ctx, s, "event-1", "p", handle)
	require.NoError(t, err)
	assert.Equal(t, first, again, "the retry replays")
	assert.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name), "one charge")
}

// The story: a consumer's handler stamps its session with each message's
// event time, and the broker delivers every message at least twice, the
// duplicates in other processes (stores) over the same table, some at
// once. Each message is charged once, however old its event.
func TestRunOnceTxEventTimeHandlersRedelivered(t *testing.T) {
	db := testDB(t)
	b, table := testBackend(t, db)
	name := moves(t, db, table)
	ctx := context.Background()
	stores := make([]*idem.Store[int], 3)
	for i := range stores {
		stores[i] = idem.New[int](idem.Options{Backend: b, TTL: 24 * time.Hour})
		defer stores[i].Close()
	}
	const messages = 8
	handle := func(msg int) func(context.Context, *sql.Tx) (int, error) {
		event := time.Now().Add(-time.Duration(msg) * 12 * time.Hour) // up to 3.5 days old
		return func(ctx context.Context, tx *sql.Tx) (int, error) {
			if err := setClock(ctx, tx, time.Until(event)); err != nil {
				return 0, err
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO "+name+" (note) VALUES (?)", fmt.Sprint(msg))
			return msg, err
		}
	}
	deliver := func(store *idem.Store[int], msg int) {
		v, err := RunOnceTx(ctx, store, fmt.Sprint("msg-", msg), msg, handle(msg))
		assert.NoError(t, err)
		assert.Equal(t, msg, v)
	}
	for msg := range messages {
		deliver(stores[0], msg) // the first delivery
		var wg sync.WaitGroup
		for _, s := range stores[1:] { // redeliveries, together
			wg.Add(1)
			go func() { defer wg.Done(); deliver(s, msg) }()
		}
		wg.Wait()
	}
	for msg := range messages {
		assert.Equal(t, 1, count(t, db, "SELECT count(*) FROM "+name+" WHERE note = ?", fmt.Sprint(msg)),
			"message %d, its event %d h old, charged once", msg, msg*12)
	}
}
