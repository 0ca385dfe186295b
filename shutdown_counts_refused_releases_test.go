package idem

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// lostClaims is a stubBackend whose claims land with their replies lost
// and cannot be read back, whose first Release hangs until its ctx ends,
// and which, as every backend does, refuses a call whose ctx has ended
// before it sends anything (backend.ErrRefused).
type lostClaims struct {
	*stubBackend
	once    sync.Once
	hanging chan struct{} // closed once the first Release hangs
}

var errReplyLost = errors.New("reply lost")

func (b *lostClaims) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	if _, _, err := b.stubBackend.Claim(ctx, rec, now, lease); err != nil {
		return backend.Record{}, false, err
	}
	return backend.Record{}, false, errReplyLost
}

func (b *lostClaims) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	return backend.Record{}, false, errReplyLost
}

func (b *lostClaims) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err)
	}
	first := false
	b.once.Do(func() { first = true })
	if first {
		close(b.hanging)
		<-ctx.Done()
		return ctx.Err()
	}
	return errReplyLost
}

// Shutdown counts every claim of unknown fate it gave up releasing, also
// those whose release the backend refused because closing had ended the
// releases' context: such a claim is still in the backend, and its key
// reads as interrupted once its lease lapses.
func TestShutdownCountsReleasesRefusedWhileClosing(t *testing.T) {
	b := &lostClaims{stubBackend: newStubBackend(), hanging: make(chan struct{})}
	s := New[int](Options{Backend: b, SettleTimeout: 100 * time.Millisecond, SweepInterval: -1})
	for _, key := range []string{"a", "b", "c"} {
		_, err := s.RunOnce(context.Background(), key, nil, func(context.Context) (int, error) {
			t.Error("fn ran under a claim of unknown fate")
			return 0, nil
		})
		if err == nil {
			t.Fatalf("%s: no error for a claim of unknown fate", key)
		}
	}
	<-b.hanging
	err := s.Shutdown(context.Background())
	if err == nil || !strings.Contains(err.Error(), "3 claims of failed or unstarted work were not released") {
		t.Fatalf("Shutdown: %v; want it to say the 3 claims it left in the backend", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.recs) != 3 {
		t.Fatalf("the backend holds %d claims, want 3", len(b.recs))
	}
}
