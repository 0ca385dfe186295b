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

// Each step and the outcome are well under MaxRecordSize, but their sum is
// over it: the operation's success is still recorded, and the key is
// completed. Were Complete to copy the steps into the completed record, the
// success could never be recorded: the key would stay pending
// (NotRecordedError), and after a restart every resume would replay the
// steps and fail the same way, whatever the caller did.
func TestStepsOverMaxRecordSizeStillComplete(t *testing.T) {
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
