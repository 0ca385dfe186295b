package bolt

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each step and the outcome are well under MaxRecordSize, and each step
// was recorded, but Complete copies the steps into the completed record:
// the sum is over the bound, so the operation's success can never be
// recorded. The key stays pending (NotRecordedError), and after a restart
// every resume replays the steps and fails the same way: the operation
// can never complete, whatever the caller does.
func TestHostileStepsPushCompleteOverMaxRecordSize(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~64 MiB")
	}
	b, _ := openTemp(t, nil)
	s := idem.New[string](idem.Options{Backend: b, Resume: true})
	defer s.Close()
	part := strings.Repeat("x", 30<<20)
	result := strings.Repeat("y", 5<<20)
	got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		for _, name := range []string{"upload-1", "upload-2"} {
			if _, err := idem.Step(ctx, name, func(context.Context) (string, error) { return part, nil }); err != nil {
				return "", err
			}
		}
		return result, nil
	})
	require.NoError(t, err, "every piece fits; the success must be recorded")
	assert.Len(t, got, len(result))
	rec, ok, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "completed", rec.State.String())
}
