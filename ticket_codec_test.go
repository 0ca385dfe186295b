package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Codec that panics in Finish (a MarshalJSON that panics): the key must
// not be stranded if the caller recovers (as net/http does for a handler).
type panicCodec struct{}

func (panicCodec) Marshal(any) ([]byte, error)        { panic("marshal boom") }
func (panicCodec) Unmarshal(data []byte, v any) error { return nil }

func TestCodecPanicInFinishReleasesKey(t *testing.T) {
	mem := newStubBackend()
	s := New[int](Options{Backend: mem, Codec: panicCodec{}, SweepInterval: -1})
	func() {
		defer func() { _ = recover() }()
		tk, err := s.Begin(context.Background(), "k", "p")
		require.NoError(t, err)
		defer tk.Release()
		tk.Finish(1, nil)
	}()
	if s.table.inFlight("k") {
		closed := make(chan struct{})
		go func() { _ = s.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(500 * time.Millisecond):
			t.Error("Close hangs")
		}
		t.Fatal("a panic in Finish (Codec) left the key in flight in memory for ever: waiters hang, Close hangs")
	}
	_ = s.Close()
}

// A Codec that returns an error: the success is answered, and the Observer
// is told of a *NotRecordedError that names the Codec and wraps its error,
// so that an operator (and the model suite) can tell an outcome that cannot
// be encoded, which is held until the store closes, from a backend write
// that will be retried.
type errCodec struct{ err error }

func (c errCodec) Marshal(any) ([]byte, error)      { return nil, c.err }
func (errCodec) Unmarshal(data []byte, v any) error { return nil }

func TestCodecErrorIsNamedInNotRecorded(t *testing.T) {
	cause := errors.New("json: unsupported type: chan int")
	var told error
	var logged bytes.Buffer
	s := New[int](Options{Backend: newStubBackend(), Codec: errCodec{cause}, SweepInterval: -1, Observer: &Observer{
		NotRecorded: func(_ context.Context, _ string, err error) { told = err },
	}, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	defer s.Close()
	v, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, v)
	var nr *NotRecordedError
	require.ErrorAs(t, told, &nr)
	require.ErrorIs(t, told, cause)
	require.Contains(t, told.Error(), "the Codec could not encode the outcome")
	assert.Contains(t, logged.String(), "level=ERROR msg=\"idem: outcome not recorded\" key=k", "the store logs it, since it returns no error")
}
