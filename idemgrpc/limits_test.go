package idemgrpc_test

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func startTCP(t *testing.T, p *payments, server ...grpc.UnaryServerInterceptor) *grpc.ClientConn {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return start(t, lis, nil, p, server)
}

// Past MaxWaiters, a duplicate of a key in flight is Aborted at once.
func TestDuplicatesPastMaxWaitersAreRefusedAtOnce(t *testing.T) {
	p := &payments{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	conn := startTCP(t, p, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}),
		idemgrpc.Options{Unscoped: true, MaxWaiters: 2, Wait: time.Hour}))
	const calls = 10
	codes_ := make(chan codes.Code, calls)
	var wg sync.WaitGroup
	send := func() {
		wg.Go(func() {
			_, err := charge(context.Background(), conn, "k", 1)
			codes_ <- code(err)
		})
	}
	send()
	<-p.entered
	for range calls - 1 {
		send()
	}
	for range calls - 3 {
		select {
		case c := <-codes_:
			require.Equal(t, codes.Aborted, c)
		case <-time.After(time.Minute):
			t.Fatal("duplicates past MaxWaiters were held")
		}
	}
	close(p.gate)
	wg.Wait()
	close(codes_)
	for c := range codes_ {
		assert.Equal(t, codes.OK, c)
	}
	assert.Equal(t, int32(1), p.runs.Load())
}

// A scope over ScopeQuota is ResourceExhausted with RetryInfo; a key whose
// outcome is not remembered holds no share of it.
func TestScopeQuota(t *testing.T) {
	p := &payments{quiet: true}
	failing := true
	var mu sync.Mutex
	p.fail = func(int32) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return status.Error(codes.Unavailable, "bank down")
		}
		return nil
	}
	conn := startTCP(t, p, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}),
		idemgrpc.Options{Unscoped: true, ScopeQuota: 2, ScopeQuotaWindow: time.Hour}))
	ctx := context.Background()
	for i := range 4 {
		_, err := charge(ctx, conn, "failed-"+strconv.Itoa(i), 1)
		require.Equal(t, codes.Unavailable, code(err), "released keys are given back")
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	for _, k := range []string{"a", "b"} {
		_, err := charge(ctx, conn, k, 1)
		require.NoError(t, err)
	}
	_, err := charge(ctx, conn, "c", 1)
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), st.Message())
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	require.NotNil(t, info, "RetryInfo says when to retry")
	assert.Positive(t, info.RetryDelay.AsDuration())
	assert.LessOrEqual(t, info.RetryDelay.AsDuration(), time.Hour+time.Hour/16+time.Second)
	before := p.runs.Load()
	_, err = charge(ctx, conn, "a", 1)
	require.NoError(t, err, "a known key replays over the quota")
	assert.Equal(t, before, p.runs.Load())
}

// A nil Scope that is not declared Unscoped is warned about once, when the
// interceptor is made.
func TestNilScopeWarnsUnlessUnscoped(t *testing.T) {
	store := newStore(t, idem.Options{})
	for _, tc := range []struct {
		opts idemgrpc.Options
		warn bool
	}{
		{idemgrpc.Options{}, true},
		{idemgrpc.Options{Unscoped: true}, false},
		{idemgrpc.Options{Scope: func(context.Context) (string, error) { return "a", nil }}, false},
	} {
		log := &countingHandler{}
		tc.opts.Logger = slog.New(log)
		idemgrpc.UnaryServerInterceptor(store, tc.opts)
		assert.Equal(t, tc.warn, log.atLeast(slog.LevelWarn) > 0, "Unscoped %v, Scope %v", tc.opts.Unscoped, tc.opts.Scope != nil)
	}
}

// countingHandler counts the records logged at each level.
type countingHandler struct {
	mu   sync.Mutex
	seen []slog.Level
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, r.Level)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) atLeast(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, v := range h.seen {
		if v >= l {
			n++
		}
	}
	return n
}

// A duplicate waiting on a key in flight spends none of its scope's quota.
func TestWaitingDuplicateSpendsNoQuota(t *testing.T) {
	entered, gate := make(chan struct{}), make(chan struct{})
	p := &payments{quiet: true, fail: func(n int32) error {
		if n == 1 { // the slow key's run
			close(entered)
			<-gate
		}
		return nil
	}}
	conn := startTCP(t, p, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}),
		idemgrpc.Options{Unscoped: true, ScopeQuota: 2, ScopeQuotaWindow: time.Hour, MaxWaiters: 1, Wait: time.Hour}))
	ctx := context.Background()
	codes_ := make(chan codes.Code, 3)
	var wg sync.WaitGroup
	send := func() {
		wg.Go(func() {
			_, err := charge(ctx, conn, "slow", 1)
			codes_ <- code(err)
		})
	}
	send()
	<-entered
	send()
	send()
	// With MaxWaiters 1, one of the two duplicates is refused at once, so
	// once one is, the other is held, waiting on the slow key.
	require.Equal(t, codes.Aborted, <-codes_)
	_, err := charge(ctx, conn, "second", 1)
	assert.NoError(t, err, "the scope has made 2 keys with a quota of 2")
	close(gate)
	wg.Wait()
}

// A handler that ends its goroutine releases its key and gives back its
// share of the quota.
func TestGoexitGivesBackTheQuota(t *testing.T) {
	p := &payments{quiet: true, fail: func(n int32) error {
		if n == 1 {
			runtime.Goexit()
		}
		return nil
	}}
	conn := startTCP(t, p, idemgrpc.UnaryServerInterceptor(newStore(t, idem.Options{}),
		idemgrpc.Options{Unscoped: true, ScopeQuota: 1, ScopeQuotaWindow: time.Hour}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = charge(ctx, conn, "exits", 1) // no answer ever comes: the deadline ends it
	_, err := charge(context.Background(), conn, "next", 1)
	assert.NoError(t, err, "the released key holds nothing")
}
