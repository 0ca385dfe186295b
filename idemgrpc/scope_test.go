package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// logRecorder is a slog.Handler that keeps each record's level and text.
type logRecorder struct {
	mu    sync.Mutex
	lines []logLine
}

type logLine struct {
	level slog.Level
	text  string // the message and its attributes
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, logLine{r.Level, b.String()})
	l.mu.Unlock()
	return nil
}

func (l *logRecorder) all() []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logLine(nil), l.lines...)
}

// The Scope function's error is the server's business: the client is told
// a fixed message, and the cause goes to the log at Debug only, since any
// client without credentials can cause it.
func TestScopeErrorIsNotSentToClient(t *testing.T) {
	logs := &logRecorder{}
	cause := errors.New("token lookup failed: db password=hunter2 at 10.0.0.7")
	p := &payments{}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{
		Scope:  func(context.Context) (string, error) { return "", cause },
		Logger: slog.New(logs),
	}, idem.Options{}))
	_, err := charge(context.Background(), conn, "k", 450)
	assert.Equal(t, codes.Unauthenticated, code(err))
	assert.Equal(t, "the caller's scope could not be determined", status.Convert(err).Message())
	assert.NotContains(t, err.Error(), "password")
	assert.Zero(t, p.runs.Load())
	lines := logs.all()
	require.NotEmpty(t, lines, "the cause is logged")
	for _, l := range lines {
		assert.Equal(t, slog.LevelDebug, l.level, "a refusal a client can cause is logged at Debug at most: %s", l.text)
	}
	assert.Contains(t, lines[0].text, cause.Error())
}

// An empty scope with no error is what a Scope returns when authentication
// did not run: it would put every such caller in one scope, so the call is
// refused (Internal), said at Error once, then at Debug.
func TestEmptyScopeIsRefused(t *testing.T) {
	logs := &logRecorder{}
	p := &payments{}
	conn := startBuf(t, p, guard(t, idemgrpc.Options{
		Scope:  func(context.Context) (string, error) { return "", nil },
		Logger: slog.New(logs),
	}, idem.Options{}))
	for range 3 {
		_, err := charge(context.Background(), conn, "k", 450)
		assert.Equal(t, codes.Internal, code(err), "%v", err)
	}
	assert.Zero(t, p.runs.Load(), "nothing runs in the empty scope")
	var errorsLogged int
	for _, l := range logs.all() {
		if l.level > slog.LevelDebug {
			errorsLogged++
			assert.Equal(t, slog.LevelError, l.level)
		}
	}
	assert.Equal(t, 1, errorsLogged, "said loudly once, then at Debug")

	// A call without a key is not guarded, and needs no scope.
	_, err := charge(context.Background(), conn, "", 450)
	require.NoError(t, err)
}
