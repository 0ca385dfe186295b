package idem_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A panic in the body of a loop over Store.Records is the caller's own:
// it goes on up the caller's stack as it was, not turned into the
// Backend's failure (nor into a runtime error for an iterator that went on
// after its loop body panicked).
func TestRecordsLoopBodyPanicGoesOnUp(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	s := idem.New[string](idem.Options{Backend: mem, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) { return "v", nil })
	require.NoError(t, err)
	type mine struct{ s string }
	escaped, _ := isolated(func() {
		for _, err := range s.Records(context.Background()) {
			require.NoError(t, err)
			panic(mine{"the caller's"})
		}
	})
	assert.Equal(t, mine{"the caller's"}, escaped)
}
