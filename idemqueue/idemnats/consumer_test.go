package idemnats

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gobolt "go.etcd.io/bbolt"
)

// Every row of idemqueue's decision table, as the JetStream message is
// settled, through a real Store over a durable (in-memory) backend.

func natsConsumer(t *testing.T, s *idem.Store[int], qopts idemqueue.Options, opts Options) *Consumer[int] {
	t.Helper()
	q, err := idemqueue.New(s, qopts)
	require.NoError(t, err)
	c, err := New(q, opts)
	require.NoError(t, err)
	return c
}

func memStore(t *testing.T, b *idemtest.MemoryBackend) *idem.Store[int] {
	t.Helper()
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	return s
}

func effect(runs *atomic.Int32) func(context.Context, jetstream.Msg) (int, error) {
	return func(context.Context, jetstream.Msg) (int, error) { return int(runs.Add(1)), nil }
}

func TestNewRefusesANilConsumer(t *testing.T) {
	_, err := New[int](nil, Options{})
	assert.Error(t, err)
}

func TestHandleRefusesNils(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{})
	var runs atomic.Int32
	_, err := c.Handle(context.Background(), nil, effect(&runs))
	assert.Error(t, err)
	m := newMsg("m1", "body")
	_, err = c.Handle(context.Background(), m, nil)
	assert.Error(t, err)
	_, err = c.HandleTx(context.Background(), m, nil)
	assert.Error(t, err)
	settles, _ := m.got()
	assert.Empty(t, settles, "a refused call settles nothing")
}

func TestDoneAndReplayedAreAcked(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{})
	var runs atomic.Int32
	first, again := newMsg("m1", "body"), newMsg("m1", "body")
	d, err := c.Handle(context.Background(), first, effect(&runs))
	require.NoError(t, err)
	assert.Equal(t, idemqueue.Ack, d.Action)
	d, err = c.Handle(context.Background(), again, effect(&runs))
	require.NoError(t, err)
	assert.True(t, d.Replayed)
	for _, m := range []*fakeMsg{first, again} {
		settles, _ := m.got()
		assert.Equal(t, []string{"ack"}, settles)
	}
	assert.Equal(t, int32(1), runs.Load())
}

func TestFinalFailureIsTerminatedOrAcked(t *testing.T) {
	for _, ackRejected := range []bool{false, true} {
		c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{AckRejected: ackRejected})
		want := "term"
		if ackRejected {
			want = "ack"
		}
		declined := func(context.Context, jetstream.Msg) (int, error) {
			return 0, idem.Final(errors.New("card declined\nfor good"))
		}
		for i, m := range []*fakeMsg{newMsg("m1", "body"), newMsg("m1", "body")} {
			d, err := c.Handle(context.Background(), m, declined)
			require.NoError(t, err)
			assert.Equal(t, idemqueue.Reject, d.Action)
			assert.Equal(t, i == 1, d.Replayed)
			settles, _ := m.got()
			assert.Equal(t, []string{want}, settles)
			assert.ErrorContains(t, d.Err, "card declined")
		}
	}
}

func TestOtherPayloadAndUnfingerprintablePayloadAreTerminated(t *testing.T) {
	var runs atomic.Int32
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{})
	_, err := c.Handle(context.Background(), newMsg("m1", "body"), effect(&runs))
	require.NoError(t, err)
	other := newMsg("m1", "another body")
	d, err := c.Handle(context.Background(), other, effect(&runs))
	require.NoError(t, err)
	assert.ErrorIs(t, d.Err, idem.ErrPayloadMismatch)
	settles, _ := other.got()
	assert.Equal(t, []string{"term"}, settles)

	// A payload that can never be fingerprinted: retrying cannot help.
	c = natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{},
		Options{Payload: func(jetstream.Msg) any { return map[string]any{"amount": math.NaN()} }})
	d, err = c.Handle(context.Background(), newMsg("m1", "body"), effect(&runs))
	require.NoError(t, err)
	assert.Equal(t, idemqueue.Reject, d.Action, "an unfingerprintable payload")
	assert.ErrorIs(t, d.Err, idem.ErrInvalidPayload)
	assert.Equal(t, int32(1), runs.Load())
}

// A message without an id (one publisher's bug) is never acked, nor
// terminated, AckRejected or not: a term deletes the message from a
// work-queue or interest stream as an ack does, so it is naked, and
// delivered again after InterruptedDelay, until an operator takes it.
func TestMessageWithoutAnIDIsNakedNeverTerminated(t *testing.T) {
	var runs atomic.Int32
	noKey := func(jetstream.Msg) (string, error) { return "", errors.New("no order id") }
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"no id", Options{}},
		{"no id, AckRejected", Options{AckRejected: true}},
		{"the key function's error", Options{Key: noKey}},
		{"the key function's error, AckRejected", Options{Key: noKey, AckRejected: true}},
	} {
		c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{InterruptedDelay: 9 * time.Second}, tc.opts)
		for _, tx := range []bool{false, true} {
			m := newMsg("", "body")
			var d idemqueue.Decision
			var err error
			if tx {
				d, err = c.HandleTx(context.Background(), m, func(context.Context, string, any) error { runs.Add(1); return nil })
			} else {
				d, err = c.Handle(context.Background(), m, effect(&runs))
			}
			require.NoError(t, err)
			assert.Equal(t, idemqueue.Hold, d.Action, tc.name)
			assert.ErrorIs(t, d.Err, idem.ErrInvalidKey, tc.name)
			settles, delay := m.got()
			assert.Equal(t, []string{"nak"}, settles, tc.name)
			assert.Equal(t, 9*time.Second, delay, tc.name)
		}
	}
	assert.Zero(t, runs.Load())

	// A key function that falls back on a field of the body handles it.
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{Key: func(m jetstream.Msg) (string, error) {
		if id := m.Headers().Get(jetstream.MsgIDHeader); id != "" {
			return id, nil
		}
		return "order-" + string(m.Data()), nil
	}})
	for range 2 {
		m := newMsg("", "42")
		d, err := c.Handle(context.Background(), m, effect(&runs))
		require.NoError(t, err)
		assert.Equal(t, idemqueue.Ack, d.Action)
	}
	assert.Equal(t, int32(1), runs.Load())
}

// A handler whose own error wraps a store's refusal (from an idempotent
// call it made downstream) failed, and nothing was recorded: naked for a
// redelivery, not terminated.
func TestHandlerErrorThatWrapsARefusalIsNaked(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{RetryDelay: 3 * time.Second}, Options{})
	for _, refusal := range []error{idem.ErrPayloadMismatch, idem.ErrInvalidKey, idem.ErrInvalidPayload} {
		for _, tx := range []bool{false, true} {
			m := newMsg("m1", "body")
			downstream := fmt.Errorf("calling the ledger: %w", refusal)
			var d idemqueue.Decision
			var err error
			if tx {
				d, err = c.HandleTx(context.Background(), m, func(context.Context, string, any) error { return downstream })
			} else {
				d, err = c.Handle(context.Background(), m, func(context.Context, jetstream.Msg) (int, error) { return 0, downstream })
			}
			require.NoError(t, err)
			assert.Equal(t, idemqueue.Retry, d.Action, "%v (tx %v)", refusal, tx)
			settles, delay := m.got()
			assert.Equal(t, []string{"nak"}, settles, "%v (tx %v)", refusal, tx)
			assert.Equal(t, 3*time.Second, delay)
		}
	}
}

func TestKeyFunctionNamesTheKey(t *testing.T) {
	var runs atomic.Int32
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{},
		Options{Key: func(m jetstream.Msg) (string, error) { return "order-" + string(m.Data()), nil }})
	for _, id := range []string{"a", "b"} { // distinct Nats-Msg-Id, one key
		_, err := c.Handle(context.Background(), newMsg(id, "42"), effect(&runs))
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), runs.Load())
}

func TestFailureAndPanicAreNakedWithTheRetryDelay(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{RetryDelay: 3 * time.Second}, Options{})
	for name, fn := range map[string]func(context.Context, jetstream.Msg) (int, error){
		"error": func(context.Context, jetstream.Msg) (int, error) { return 0, errors.New("timeout") },
		"panic": func(context.Context, jetstream.Msg) (int, error) { panic("bug") },
	} {
		m := newMsg("m-"+name, "body")
		d, err := c.Handle(context.Background(), m, fn)
		require.NoError(t, err)
		assert.Equal(t, idemqueue.Retry, d.Action, name)
		settles, delay := m.got()
		assert.Equal(t, []string{"nak"}, settles, name)
		assert.Equal(t, 3*time.Second, delay, name)
		var runs atomic.Int32
		_, err = c.Handle(context.Background(), newMsg("m-"+name, "body"), effect(&runs))
		require.NoError(t, err)
		assert.Equal(t, int32(1), runs.Load(), "%s: the redelivery runs", name)
	}
}

func TestBusyElsewhereIsNakedWithTheBusyDelay(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	other := memStore(t, b) // another process holds the key
	tk, err := other.Begin(context.Background(), "m1", []byte("body"))
	require.NoError(t, err)
	defer tk.Release()
	c := natsConsumer(t, memStore(t, b), idemqueue.Options{BusyDelay: 4 * time.Second}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	m := newMsg("m1", "body")
	var runs atomic.Int32
	d, err := c.Handle(ctx, m, effect(&runs))
	require.NoError(t, err)
	assert.ErrorIs(t, d.Err, idem.ErrInProgress)
	settles, delay := m.got()
	assert.Equal(t, []string{"nak"}, settles)
	assert.Equal(t, 4*time.Second, delay)
	assert.Zero(t, runs.Load())
}

func TestStoreThatCannotAnswerIsNaked(t *testing.T) {
	s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
	require.NoError(t, s.Close())
	c := natsConsumer(t, s, idemqueue.Options{}, Options{})
	m := newMsg("m1", "body")
	var runs atomic.Int32
	d, err := c.Handle(context.Background(), m, effect(&runs))
	require.NoError(t, err)
	assert.ErrorIs(t, d.Err, idem.ErrClosed)
	settles, delay := m.got()
	assert.Equal(t, []string{"nak"}, settles)
	assert.Equal(t, time.Second, delay)
}

func TestInterruptedIsNakedOrReconciled(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	dead := idem.New[int](idem.Options{Backend: b})
	tk, err := dead.Begin(context.Background(), "m1", []byte("body"))
	require.NoError(t, err)
	b.Crash() // the process died in the handler
	t.Cleanup(func() { tk.Release(); dead.Close() })

	s := memStore(t, b)
	var runs atomic.Int32
	m := newMsg("m1", "body")
	d, err := natsConsumer(t, s, idemqueue.Options{}, Options{}).Handle(context.Background(), m, effect(&runs))
	require.NoError(t, err)
	assert.ErrorIs(t, d.Err, idem.ErrOutcomeUnknown)
	settles, delay := m.got()
	assert.Equal(t, []string{"nak"}, settles)
	assert.Equal(t, time.Minute, delay, "kept for an operator, retried later")

	c := natsConsumer(t, s, idemqueue.Options{Reconcile: func(ctx context.Context, key string, _ error) idemqueue.Decision {
		if err := s.Resolve(ctx, key, 9, nil); err != nil { // the effect's target says it happened
			return idemqueue.Decision{Action: idemqueue.Retry, Delay: time.Second, Err: err}
		}
		return idemqueue.Decision{Action: idemqueue.Ack}
	}}, Options{})
	m = newMsg("m1", "body")
	d, err = c.Handle(context.Background(), m, effect(&runs))
	require.NoError(t, err)
	assert.Equal(t, idemqueue.Ack, d.Action)
	settles, _ = m.got()
	assert.Equal(t, []string{"ack"}, settles)
	assert.Zero(t, runs.Load())
}

// An ack lost with the connection: the error is returned, the broker
// redelivers after AckWait, and the redelivery replays.
func TestLostAckIsReturnedAndTheRedeliveryReplays(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{})
	var runs atomic.Int32
	m := newMsg("m1", "body")
	m.failSettle = errors.New("nats: connection closed")
	_, err := c.Handle(context.Background(), m, effect(&runs))
	assert.ErrorContains(t, err, "connection closed")
	d, err := c.Handle(context.Background(), newMsg("m1", "body"), effect(&runs))
	require.NoError(t, err)
	assert.True(t, d.Replayed)
	assert.Equal(t, int32(1), runs.Load())
}

// While the handler runs the message is marked InProgress, and never
// after it is settled.
func TestInProgressWhileTheHandlerRuns(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{ProgressInterval: time.Millisecond})
	m := newMsg("m1", "body")
	m.marked = make(chan struct{})
	_, err := c.Handle(context.Background(), m, func(context.Context, jetstream.Msg) (int, error) {
		for range 3 {
			<-m.marked
		}
		return 1, nil
	})
	require.NoError(t, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	assert.GreaterOrEqual(t, m.inProgress, 3)
	assert.Zero(t, m.afterDone, "marked after it was settled")
}

// The marks stop when the claim's lease is lost: the broker may then
// redeliver the message to whoever takes the key over.
func TestInProgressStopsWhenTheLeaseIsLost(t *testing.T) {
	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{ProgressInterval: time.Millisecond})
	p := c.progress(newMsg("m1", "body"))
	claim, lose := context.WithCancelCause(context.Background())
	defer p.follow(claim)()
	lose(idem.ErrLeaseLost)
	<-p.left // ended without stop
	p.stop()

	p = c.progress(newMsg("m2", "body"))
	claim, end := context.WithCancelCause(context.Background())
	unfollow := p.follow(claim)
	unfollow()
	end(errors.New("finished"))
	select {
	case <-p.left:
		t.Fatal("marks stopped by a claim that ended for another reason")
	default:
	}
	p.stop()
}

// HandleTx: the handler's writes commit with the key and its outcome in
// one bolt transaction; a redelivery applies nothing again.
func TestHandleTxAppliesTheEffectOnce(t *testing.T) {
	b, err := bolt.Open(t.TempDir()+"/idem.db", nil)
	require.NoError(t, err)
	defer b.Close()
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	c := natsConsumer(t, s, idemqueue.Options{}, Options{})
	apply := func(ctx context.Context, key string, payload any) error {
		_, err := bolt.RunOnceTx(ctx, s, key, payload, func(ctx context.Context, tx *gobolt.Tx) (int, error) {
			bk, err := tx.CreateBucketIfNotExists([]byte("stock"))
			if err != nil {
				return 0, err
			}
			n := 0
			if v := bk.Get([]byte("n")); v != nil {
				n = int(v[0])
			}
			return n + 1, bk.Put([]byte("n"), []byte{byte(n + 1)})
		})
		return err
	}
	for i := range 3 {
		d, err := c.HandleTx(context.Background(), newMsg("m1", "body"), apply)
		require.NoError(t, err)
		assert.Equal(t, idemqueue.Ack, d.Action, "delivery %d", i)
	}
	require.NoError(t, b.View(context.Background(), func(tx *gobolt.Tx) error {
		assert.Equal(t, []byte{1}, tx.Bucket([]byte("stock")).Get([]byte("n")))
		return nil
	}))

	m := newMsg("m2", "body")
	d, err := c.HandleTx(context.Background(), m, func(context.Context, string, any) error { panic("bug") })
	require.NoError(t, err)
	assert.Equal(t, idemqueue.Retry, d.Action, "a panicking call is retried")
	var pe *idem.PanicError
	assert.ErrorAs(t, d.Err, &pe)
}

// A panic in Options.Key or Options.Payload does not escape Handle: the
// message is retried, not rejected (a bug a fixed deploy may not have);
// and a handler or call that calls runtime.Goexit leaves no message
// unsettled, nor HandleTx's InProgress marks going on for ever.
func TestUserCodeThatPanicsOrExitsIsRetried(t *testing.T) {
	var runs atomic.Int32
	for name, opts := range map[string]Options{
		"key":     {Key: func(jetstream.Msg) (string, error) { panic("key bug") }},
		"payload": {Payload: func(jetstream.Msg) any { panic("decoder bug") }},
	} {
		c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, opts)
		for _, tx := range []bool{false, true} {
			m := newMsg("m1", "body")
			var d idemqueue.Decision
			var err error
			require.NotPanics(t, func() {
				if tx {
					d, err = c.HandleTx(context.Background(), m, func(context.Context, string, any) error { return nil })
				} else {
					d, err = c.Handle(context.Background(), m, effect(&runs))
				}
			}, name)
			require.NoError(t, err)
			assert.Equal(t, idemqueue.Retry, d.Action, name)
			settles, _ := m.got()
			assert.Equal(t, []string{"nak"}, settles, name)
		}
	}
	assert.Zero(t, runs.Load())

	c := natsConsumer(t, memStore(t, idemtest.NewMemoryBackend()), idemqueue.Options{}, Options{ProgressInterval: time.Millisecond})
	for _, tx := range []bool{false, true} {
		m := newMsg(fmt.Sprint("exits-", tx), "body")
		done := make(chan idemqueue.Decision)
		go func() {
			var d idemqueue.Decision
			if tx {
				d, _ = c.HandleTx(context.Background(), m, func(context.Context, string, any) error { runtime.Goexit(); return nil })
			} else {
				d, _ = c.Handle(context.Background(), m, func(context.Context, jetstream.Msg) (int, error) { runtime.Goexit(); return 0, nil })
			}
			done <- d
		}()
		d := <-done // Handle returned: the Goexit was contained
		assert.Equal(t, idemqueue.Retry, d.Action)
		settles, _ := m.got()
		assert.Equal(t, []string{"nak"}, settles)
		m.mu.Lock()
		assert.Zero(t, m.afterDone, "marked after it was settled")
		m.mu.Unlock()
	}
}
