package idem_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Without recording (no Backend, or Resume off) Step records nothing, so
// it has no business encoding the result: a result the Codec cannot encode
// (NaN in JSON, a channel) must come back as fn returned it, without an
// error. Encoding it anyway would turn a step whose side effect happened
// into a failure, so that the caller failed and retried the side effect.
func TestStepWithoutRecordingReturnsAnUnencodableResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts idem.Options
	}{
		{"memory-only", idem.Options{}},
		{"backend-without-resume", idem.Options{Backend: idemtest.NewMemoryBackend()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore[float64](t, tc.opts)
			var stepErr error
			got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (float64, error) {
				_, err := idem.Step(ctx, "measure", func(context.Context) (float64, error) { return math.NaN(), nil })
				stepErr = err
				return 1, nil
			})
			require.NoError(t, err)
			assert.Equal(t, 1.0, got)
			assert.NoError(t, stepErr, "Step records nothing here; it must not fail on encoding")
		})
	}
}

// A step whose fn returned a Final error ("card declined") with a result
// the Codec cannot encode: Step must still return that final error (the
// caller decides on it), joined with the encoding failure if it likes,
// never dropped for the encoding error alone.
func TestStepFinalErrorKeptWhenValueUnencodable(t *testing.T) {
	s := newStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	declined := errors.New("card declined")
	var stepErr error
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, stepErr = idem.Step(ctx, "charge", func(context.Context) (float64, error) {
			return math.Inf(1), idem.Final(declined)
		})
		return "", stepErr
	})
	require.Error(t, stepErr)
	assert.ErrorIs(t, stepErr, declined, "the step's own final error is not lost")
}

// panickyMarshal's MarshalJSON panics.
type panickyMarshal struct{}

func (panickyMarshal) MarshalJSON() ([]byte, error) { panic("MarshalJSON exploded") }

// The library's rule (durable.go, marshal): a panic in the Codec is
// returned as an error, "so that it can neither leave a key claimed nor
// escape the library". Step's own encoding keeps that rule: with a Ticket
// (no RunOnce recover around the work), a panic there does not reach the
// caller of Step.
func TestStepCodecPanicDoesNotEscape(t *testing.T) {
	s := newStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	defer tk.Release()
	var (
		stepErr  error
		panicked any
	)
	func() {
		defer func() { panicked = recover() }()
		_, stepErr = idem.Step(tk.Context(), "s", func(context.Context) (panickyMarshal, error) { return panickyMarshal{}, nil })
	}()
	assert.Nil(t, panicked, "a Codec panic escaped Step")
	assert.Error(t, stepErr)
	_, _ = tk.Finish("", errors.New("done"))
}

// The same step name used for two different result types in one
// operation: the second call gets an error (the first's outcome does not
// decode into it), never a silently zero value.
func TestStepSameNameOtherTypeIsAnError(t *testing.T) {
	s := newStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	var second error
	var got struct{ X []int }
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "x", func(context.Context) (string, error) { return "str", nil }); err != nil {
			return "", err
		}
		got, second = idem.Step(ctx, "x", func(context.Context) (struct{ X []int }, error) {
			return struct{ X []int }{[]int{1}}, nil
		})
		return "", nil
	})
	assert.ErrorContains(t, second, "was called with string before")
	assert.Nil(t, got.X)
}
