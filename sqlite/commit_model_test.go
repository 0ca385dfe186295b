package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// A queuedWrite is one write of the committer's model test, and what the
// model says it must answer.
type queuedWrite struct {
	kind     string // claim, complete, release, fail
	key, tok string
	withdraw bool // its caller leaves before the committer takes it
}

// modelRow is the model's record of a key.
type modelRow struct {
	token string
	done  bool
}

// TestCommitterModel drives the committer with random batches of writes
// queued behind a held write turn, some of them failing after a write and
// some withdrawn by their callers, and checks every answer and the table
// against a model that applies them one at a time, in queue order: a
// shared transaction must be indistinguishable from one transaction per
// write, and a failure or a withdrawal must leave nothing behind.
func TestCommitterModel(t *testing.T) {
	b, _ := testBackend(t)
	ctx := context.Background()
	_, err := b.db.ExecContext(ctx, `CREATE TABLE side (x INTEGER)`)
	require.NoError(t, err)
	now := time.Now()
	boom := errors.New("boom")

	rapid.Check(t, func(rt *rapid.T) {
		_, err := b.db.ExecContext(ctx, `DELETE FROM idem_keys; DELETE FROM side`)
		require.NoError(rt, err)
		writes := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) queuedWrite {
			return queuedWrite{
				kind:     rapid.SampledFrom([]string{"claim", "claim", "complete", "release", "fail"}).Draw(rt, "kind"),
				key:      rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "key"),
				tok:      rapid.SampledFrom([]string{"t1", "t2"}).Draw(rt, "token"),
				withdraw: rapid.IntRange(0, 5).Draw(rt, "withdraw") == 0,
			}
		}), 1, 2*maxBatch+10).Draw(rt, "writes")

		release := holdWrites(b)
		answers := make([]chan error, len(writes))
		cancels := make([]context.CancelFunc, len(writes))
		for i, w := range writes {
			wctx, cancel := context.WithCancel(ctx)
			cancels[i] = cancel
			answers[i] = make(chan error, 1)
			go func() { answers[i] <- apply(wctx, b, w, now, boom) }()
			waitQueued(t, b, i+1)
		}
		for i, w := range writes {
			if w.withdraw {
				cancels[i]()
				require.ErrorIs(rt, <-answers[i], backend.ErrRefused, "write %d, withdrawn", i)
			}
		}
		release()

		model := map[string]modelRow{}
		for i, w := range writes {
			if w.withdraw {
				continue
			}
			err := <-answers[i]
			cancels[i]()
			want := step(model, w)
			switch {
			case w.kind == "fail":
				require.ErrorIs(rt, err, boom, "write %d %+v", i, w)
			case want:
				require.NoError(rt, err, "write %d %+v", i, w)
			case w.kind == "claim":
				require.ErrorIs(rt, err, errLost, "write %d %+v", i, w)
			default:
				require.ErrorIs(rt, err, backend.ErrNotOwner, "write %d %+v", i, w)
			}
		}

		var side int
		require.NoError(rt, b.db.QueryRowContext(ctx, `SELECT count(*) FROM side`).Scan(&side))
		require.Zero(rt, side, "a failed write's changes were committed")
		for _, key := range []string{"a", "b", "c"} {
			rec, ok, err := b.Get(ctx, key, now)
			require.NoError(rt, err)
			m, want := model[key]
			require.Equal(rt, want, ok, "key %s present", key)
			if ok {
				require.Equal(rt, m.token, rec.Token, "key %s", key)
				require.Equal(rt, m.done, rec.State == backend.StateCompleted, "key %s completed", key)
			}
		}
	})
}

// errLost is apply's answer for a claim that found the key taken.
var errLost = errors.New("claim lost")

// apply sends w to b and returns its answer.
func apply(ctx context.Context, b *Backend, w queuedWrite, now time.Time, boom error) error {
	switch w.kind {
	case "claim":
		_, won, err := b.Claim(ctx, backend.Record{Key: w.key, Token: w.tok, State: backend.StatePending}, now, time.Hour)
		if err == nil && !won {
			err = errLost
		}
		return err
	case "complete":
		return b.Complete(ctx, backend.Record{Key: w.key, Token: w.tok, State: backend.StateCompleted}, now, time.Hour)
	case "release":
		return b.Release(ctx, w.key, w.tok)
	case "fail":
		return b.do(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO side VALUES (1)`); err != nil {
				return err
			}
			// A claim's write inside the failing op: taken back with it.
			if _, err := b.execIn(ctx, tx, `DELETE FROM idem_keys WHERE key = ?1`, w.key); err != nil {
				return err
			}
			return boom
		})
	}
	return fmt.Errorf("unknown write %q", w.kind)
}

// step applies w to the model and reports whether it succeeds.
func step(model map[string]modelRow, w queuedWrite) bool {
	row, ok := model[w.key]
	switch w.kind {
	case "claim":
		if ok {
			return false
		}
		model[w.key] = modelRow{token: w.tok}
		return true
	case "complete":
		if !ok || row.token != w.tok || row.done {
			return false
		}
		model[w.key] = modelRow{token: w.tok, done: true}
		return true
	case "release":
		if !ok || row.token != w.tok || row.done {
			return false
		}
		delete(model, w.key)
		return true
	}
	return false
}
