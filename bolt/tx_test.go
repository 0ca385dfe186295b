package bolt

import (
	"context"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/txtest"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// moves is the caller's own bucket in the tests.
var moves = []byte("moves")

func TestRunOnceTx(t *testing.T) {
	txtest.Run(t, txtest.Harness{
		New: func(t *testing.T, opts idem.Options) (*idem.Store[int], func() int) {
			b, _ := openTemp(t, nil)
			require.NoError(t, b.Update(context.Background(), func(tx *bbolt.Tx) error {
				_, err := tx.CreateBucketIfNotExists(moves)
				return err
			}))
			opts.Backend = b
			s := idem.New[int](opts)
			t.Cleanup(func() { s.Close() })
			return s, func() int {
				n := 0
				require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error {
					n = tx.Bucket(moves).Stats().KeyN
					return nil
				}))
				return n
			}
		},
		RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func() (int, error)) (int, error)) (int, error) {
			if fn == nil {
				return RunOnceTx(ctx, s, key, payload, nil)
			}
			return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx *bbolt.Tx) (int, error) {
				return fn(ctx, func() (int, error) {
					bk := tx.Bucket(moves)
					id, err := bk.NextSequence()
					if err != nil {
						return 0, err
					}
					return int(id), bk.Put(itob(id), []byte(key))
				})
			})
		},
	})
}

func itob(v uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[7-i] = byte(v >> (8 * i))
	}
	return b
}

// idemtest's session-clock check: bolt's instants are the store's
// Options.Now, which fn's transaction cannot move, so the shift does
// nothing.
func TestRunOnceTxSessionClock(t *testing.T) {
	idemtest.RunSessionClock(t, idemtest.SessionClockHarness{
		Backend: func(t *testing.T) backend.Backend {
			b, _ := openTemp(t, nil)
			return b
		},
		RunOnceTx: func(ctx context.Context, s *idem.Store[int], key string, payload any, fn func(context.Context, func(time.Duration) error) (int, error)) (int, error) {
			return RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ *bbolt.Tx) (int, error) {
				return fn(ctx, func(time.Duration) error { return nil })
			})
		},
	})
}
