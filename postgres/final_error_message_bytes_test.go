package postgres

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A final error's message is whatever the caller's error says: a NUL byte
// or bytes that are not UTF-8 (a declined card's raw reason, say) must not
// keep the outcome from being recorded in err_msg, a text column. Before,
// Complete failed with SQLSTATE 22021: RunOnce left the key claimed after fn
// had run (interrupted once this process is gone: ErrOutcomeUnknown, not the
// final error), and RunOnceTx rolled back, so every retry ran fn again.
func TestFinalErrorMessageOfAnyBytesIsRecorded(t *testing.T) {
	const msg = "declined \x00 nul, \xff\xfe not UTF-8"
	ctx := context.Background()
	pool := testPool(t)
	for _, mode := range []string{"RunOnce", "RunOnceTx"} {
		t.Run(mode, func(t *testing.T) {
			b, _ := testBackend(t, pool)
			s := idem.New[string](idem.Options{Backend: b})
			t.Cleanup(func() { _ = s.Close() })
			var calls atomic.Int32
			run := func() error {
				var err error
				switch mode {
				case "RunOnce":
					_, err = s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
						calls.Add(1)
						return "", idem.Final(errors.New(msg))
					})
				default:
					_, err = RunOnceTx(ctx, s, "k", "p", func(context.Context, pgx.Tx) (string, error) {
						calls.Add(1)
						return "", idem.Final(errors.New(msg))
					})
				}
				return err
			}
			first := run()
			require.True(t, idem.IsFinal(first), "first call: %v", first)
			var nr *idem.NotRecordedError
			require.False(t, errors.As(first, &nr), "the outcome is recorded: %v", first)
			rec, ok, err := b.Get(ctx, "k", time.Now())
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, backend.StateCompleted, rec.State, "the record is completed")
			require.True(t, rec.Failed)
			again := run()
			require.True(t, idem.IsFinal(again), "the final error is replayed, not %v", again)
			assert.NotErrorIs(t, again, idem.ErrOutcomeUnknown)
			assert.Equal(t, int32(1), calls.Load(), "fn runs once")
			assert.True(t, strings.HasPrefix(again.Error(), "declined "), "replayed message %q", again.Error())
		})
	}
}

// The same message, its Complete's reply lost: the read-back finds the
// message as PostgreSQL keeps it (backend.StorableText) and takes it for
// the store's own outcome. Before, the two messages differed, the outcome
// was taken for another owner's, and it was reported not recorded, the
// claim lost.
func TestFinalErrorMessageOfAnyBytesReadBackAfterALostReply(t *testing.T) {
	const msg = "declined \x00 nul, \xff\xfe not UTF-8"
	ctx := context.Background()
	b, _ := testBackend(t, testPool(t))
	var lost atomic.Bool
	f := idemtest.Faulty{Backend: b, Lose: func(op string) error {
		if op == "Complete" && lost.CompareAndSwap(false, true) {
			return errors.New("connection reset by peer")
		}
		return nil
	}}
	var unrecorded atomic.Int32
	s := idem.New[string](idem.Options{Backend: f, Observer: &idem.Observer{
		NotRecorded: func(context.Context, string, error) { unrecorded.Add(1) },
	}})
	t.Cleanup(func() { _ = s.Close() })
	var calls atomic.Int32
	run := func() error {
		_, err := s.RunOnce(ctx, "k", "p", func(context.Context) (string, error) {
			calls.Add(1)
			return "", idem.Final(errors.New(msg))
		})
		return err
	}
	first := run()
	require.True(t, lost.Load(), "the Complete's reply was lost")
	require.True(t, idem.IsFinal(first), "first call: %v", first)
	assert.Zero(t, unrecorded.Load(), "the outcome that landed was reported not recorded")
	again := run()
	require.True(t, idem.IsFinal(again), "the final error is replayed, not %v", again)
	assert.Equal(t, int32(1), calls.Load(), "fn runs once")
}
