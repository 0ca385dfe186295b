package idemqueue

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What the package doc says a restarted consumer meets for the claims its
// dead predecessor held: bolt reads them as interrupted at Open, sqlite
// as in progress until their leases lapse; either way a delayed retry,
// never a hot one, a dead letter nor a second run. The predecessor's
// claim is written straight to the backend and the file closed under it,
// which is what a kill leaves on disk (the kill loops do it with SIGKILL).
func TestRestartedConsumerRetriesItsPredecessorsClaimsLater(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reopen func(t *testing.T, predecessor func(backend.Backend)) backend.Backend
		want   Decision
	}{
		{"bolt", func(t *testing.T, predecessor func(backend.Backend)) backend.Backend {
			path := filepath.Join(t.TempDir(), "idem.db")
			b, err := bolt.Open(path, nil)
			require.NoError(t, err)
			predecessor(b)
			require.NoError(t, b.Close())
			b, err = bolt.Open(path, nil)
			require.NoError(t, err)
			t.Cleanup(func() { b.Close() })
			return b
		}, Decision{Action: Retry, Delay: time.Minute}},
		{"sqlite", func(t *testing.T, predecessor func(backend.Backend)) backend.Backend {
			path := filepath.Join(t.TempDir(), "idem.sqlite")
			open := func() backend.Backend {
				db, err := sqlite.Open(path)
				require.NoError(t, err)
				t.Cleanup(func() { db.Close() })
				b, err := sqlite.New(context.Background(), db, sqlite.Options{})
				require.NoError(t, err)
				return b
			}
			predecessor(open())
			return open()
		}, Decision{Action: Retry, Delay: 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp, err := idem.DefaultFingerprint("body")
			require.NoError(t, err)
			b := tc.reopen(t, func(b backend.Backend) {
				_, won, err := b.Claim(context.Background(), backend.Record{Key: "m1", Fingerprint: fp, Token: "killed", State: backend.StatePending}, time.Now(), 30*time.Second)
				require.NoError(t, err)
				require.True(t, won)
			})
			c := consumer(t, b, Options{InterruptedDelay: time.Minute, BusyDelay: 3 * time.Second, BusyWait: 10 * time.Millisecond})
			runs := 0
			d := c.Handle(context.Background(), "m1", "body", func(context.Context) (int, error) { runs++; return 1, nil })
			assert.Equal(t, tc.want.Action, d.Action, d.Err)
			assert.Equal(t, tc.want.Delay, d.Delay)
			assert.Zero(t, runs, "the predecessor's handler may have applied its effect: nothing runs again")
		})
	}
}
