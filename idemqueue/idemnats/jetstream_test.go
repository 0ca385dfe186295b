package idemnats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The decision table against a real JetStream server: each row's message
// is published to a stream of the test's own, consumed by a Consume
// callback, settled, and then seen settled by the server (nothing pending,
// nothing awaiting an ack) or redelivered as the row says.

// stream is a test's own stream and durable consumer on the server
// IDEM_NATS_URL names, deleted afterwards.
type stream struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	name    string
	subject string
	cons    jetstream.Consumer
}

func newStream(t testing.TB, ackWait time.Duration) *stream {
	t.Helper()
	url := svctest.NATS(t)
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var r [4]byte
	_, _ = rand.Read(r[:])
	s := &stream{nc: nc, js: js, name: "IDEMTEST_" + strings.ToUpper(hex.EncodeToString(r[:]))}
	s.subject = "idemtest." + hex.EncodeToString(r[:])
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}, Duplicates: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.name) })
	s.cons, err = js.CreateOrUpdateConsumer(ctx, s.name, jetstream.ConsumerConfig{
		Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 64,
	})
	require.NoError(t, err)
	return s
}

// publish publishes data under id n times, each one stored: a publish
// within the stream's dedupe window, which JetStream drops, is made again
// once the window has passed.
func (s *stream) publish(t testing.TB, id, data string, n int) {
	t.Helper()
	ctx := context.Background()
	opts := []jetstream.PublishOpt{}
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	for n > 0 {
		ack, err := s.js.Publish(ctx, s.subject, []byte(data), opts...)
		require.NoError(t, err)
		if ack.Duplicate {
			time.Sleep(20 * time.Millisecond) // the server's window passing
			continue
		}
		n--
	}
}

// settled waits until the server holds nothing undelivered or unacked
// for the consumer.
func (s *stream) settled(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := s.cons.Info(context.Background())
		require.NoError(t, err)
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "not settled: %d pending, %d awaiting an ack", info.NumPending, info.NumAckPending)
		time.Sleep(20 * time.Millisecond)
	}
}

// deliveries records each delivery's decision, by message id.
type deliveries struct {
	mu   sync.Mutex
	seen map[string][]idemqueue.Decision
	errs []error
	ch   chan string // each id, as it is decided
}

func (d *deliveries) record(msg jetstream.Msg, dec idemqueue.Decision, err error) {
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	d.mu.Lock()
	if d.seen == nil {
		d.seen = map[string][]idemqueue.Decision{}
	}
	d.seen[id] = append(d.seen[id], dec)
	if err != nil {
		d.errs = append(d.errs, err)
	}
	d.mu.Unlock()
	d.ch <- id
}

func (d *deliveries) of(id string) []idemqueue.Action {
	d.mu.Lock()
	defer d.mu.Unlock()
	var as []idemqueue.Action
	for _, dec := range d.seen[id] {
		as = append(as, dec.Action)
	}
	return as
}

// waitFor waits until id has been decided n times in all.
func (d *deliveries) waitFor(t testing.TB, id string, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for len(d.of(id)) < n {
		select {
		case <-d.ch:
		case <-timeout:
			t.Fatalf("%s decided %v, waiting for %d decisions", id, d.of(id), n)
		}
	}
}

func TestDecisionTableOverJetStream(t *testing.T) {
	s := newStream(t, 5*time.Second)
	b := idemtest.NewMemoryBackend()

	// An interrupted key: its process died in the handler.
	dead := idem.New[int](idem.Options{Backend: b})
	tk, err := dead.Begin(context.Background(), "interrupted", []byte("body"))
	require.NoError(t, err)
	b.Crash()
	t.Cleanup(func() { tk.Release(); dead.Close() })
	// A busy key: another process is handling it.
	other := idem.New[int](idem.Options{Backend: b})
	defer other.Close()
	busy, err := other.Begin(context.Background(), "busy", []byte("body"))
	require.NoError(t, err)

	store := idem.New[int](idem.Options{Backend: b})
	defer store.Close()
	reconciled := make(chan string, 4)
	q, err := idemqueue.New(store, idemqueue.Options{
		RetryDelay: 50 * time.Millisecond, BusyDelay: 50 * time.Millisecond, InterruptedDelay: 50 * time.Millisecond,
		Reconcile: func(ctx context.Context, key string, err error) idemqueue.Decision {
			reconciled <- key
			if len(reconciled) == 1 { // the first time: kept, retried later
				return idemqueue.Decision{Action: idemqueue.Retry, Delay: 50 * time.Millisecond, Err: err}
			}
			if err := store.Resolve(ctx, key, 9, nil); err != nil { // the target says it happened
				return idemqueue.Decision{Action: idemqueue.Retry, Delay: 50 * time.Millisecond, Err: err}
			}
			return idemqueue.Decision{Action: idemqueue.Ack}
		},
	})
	require.NoError(t, err)
	c, err := New(q, Options{ProgressInterval: 100 * time.Millisecond})
	require.NoError(t, err)

	var mu sync.Mutex
	effects := map[string]int{}
	failedOnce := map[string]bool{}
	fn := func(ctx context.Context, msg jetstream.Msg) (int, error) {
		id := msg.Headers().Get(jetstream.MsgIDHeader)
		mu.Lock()
		defer mu.Unlock()
		switch id {
		case "final":
			return 0, idem.Final(errors.New("card declined"))
		case "transient":
			if !failedOnce[id] {
				failedOnce[id] = true
				return 0, errors.New("timeout")
			}
		case "panics":
			if !failedOnce[id] {
				failedOnce[id] = true
				panic("bug")
			}
		}
		effects[id]++
		return effects[id], nil
	}
	var d deliveries
	d.ch = make(chan string, 100)
	cc, err := s.cons.Consume(func(msg jetstream.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		dec, err := c.Handle(ctx, msg, fn)
		d.record(msg, dec, err)
	})
	require.NoError(t, err)
	defer cc.Stop()

	s.publish(t, "ok", "body", 1)
	s.publish(t, "twice", "body", 2) // the publisher sent it again, after the dedupe window
	s.publish(t, "final", "body", 1)
	s.publish(t, "transient", "body", 1)
	s.publish(t, "panics", "body", 1)
	s.publish(t, "interrupted", "body", 1)
	s.publish(t, "busy", "body", 1)
	s.publish(t, "ok", "another body", 1) // the id again, with another payload

	d.waitFor(t, "twice", 2)
	d.waitFor(t, "transient", 2)
	d.waitFor(t, "panics", 2)
	d.waitFor(t, "interrupted", 2)
	d.waitFor(t, "busy", 1)
	_, err = busy.Finish(5, nil) // the other process finishes: the redelivery replays
	require.NoError(t, err)
	d.waitFor(t, "ok", 2)
	d.waitFor(t, "final", 1)
	s.settled(t)
	cc.Stop()

	A, R, T := idemqueue.Ack, idemqueue.Reject, idemqueue.Retry
	assert.Equal(t, []idemqueue.Action{A, R}, d.of("ok"), "then another payload: terminated")
	assert.Equal(t, []idemqueue.Action{A, A}, d.of("twice"), "the second replayed")
	assert.Equal(t, []idemqueue.Action{R}, d.of("final"))
	assert.Equal(t, []idemqueue.Action{T, A}, d.of("transient"))
	assert.Equal(t, []idemqueue.Action{T, A}, d.of("panics"))
	assert.Equal(t, []idemqueue.Action{T, A}, d.of("interrupted"), "kept once, then reconciled")
	busyActions := d.of("busy")
	assert.Equal(t, A, busyActions[len(busyActions)-1])
	for _, a := range busyActions[:len(busyActions)-1] {
		assert.Equal(t, T, a, "busy elsewhere: naked")
	}
	mu.Lock()
	assert.Equal(t, map[string]int{"ok": 1, "twice": 1, "transient": 1, "panics": 1}, effects)
	mu.Unlock()
	assert.Empty(t, d.errs, "settling errors")
}

// A handler that runs past AckWait is not redelivered meanwhile: the
// InProgress marks hold it.
func TestInProgressHoldsALongHandlerOverJetStream(t *testing.T) {
	const ackWait = time.Second
	s := newStream(t, ackWait)
	store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
	defer store.Close()
	q, err := idemqueue.New(store, idemqueue.Options{})
	require.NoError(t, err)
	c, err := New(q, Options{ProgressInterval: ackWait / 5})
	require.NoError(t, err)
	var d deliveries
	d.ch = make(chan string, 10)
	cc, err := s.cons.Consume(c.MessageHandler(context.Background(), func(context.Context, jetstream.Msg) (int, error) {
		time.Sleep(3 * ackWait) // the work itself: longer than AckWait
		return 1, nil
	}, d.record))
	require.NoError(t, err)
	defer cc.Stop()
	s.publish(t, "long", "body", 1)
	d.waitFor(t, "long", 1)
	s.settled(t)
	info, err := s.cons.Info(context.Background())
	require.NoError(t, err)
	assert.Zero(t, info.NumRedelivered, "redelivered while its handler ran")
	assert.Equal(t, []idemqueue.Action{idemqueue.Ack}, d.of("long"))
}

// A message without an id (one publisher's bug) is never acked nor
// terminated, AckRejected or not: naked, it is delivered again after
// InterruptedDelay, and no MSG_TERMINATED advisory is sent for it.
func TestMessageWithoutAnIDIsKeptOverJetStream(t *testing.T) {
	for _, ackRejected := range []bool{false, true} {
		s := newStream(t, time.Second)
		advisories := make(chan *nats.Msg, 16)
		sub, err := s.nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+s.name+".worker", advisories)
		require.NoError(t, err)
		defer sub.Unsubscribe()
		require.NoError(t, s.nc.Flush())

		store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
		defer store.Close()
		q, err := idemqueue.New(store, idemqueue.Options{InterruptedDelay: 50 * time.Millisecond})
		require.NoError(t, err)
		c, err := New(q, Options{AckRejected: ackRejected})
		require.NoError(t, err)
		var d deliveries
		d.ch = make(chan string, 100)
		cc, err := s.cons.Consume(c.MessageHandler(context.Background(), func(context.Context, jetstream.Msg) (int, error) {
			t.Error("a message without an id ran")
			return 0, nil
		}, d.record))
		require.NoError(t, err)
		defer cc.Stop()
		s.publish(t, "", "no id", 1)
		d.waitFor(t, "", 3)
		cc.Stop()
		assert.Equal(t, []idemqueue.Action{idemqueue.Hold, idemqueue.Hold, idemqueue.Hold}, d.of("")[:3], "ackRejected %v", ackRejected)
		assert.Empty(t, advisories, "ackRejected %v: terminated", ackRejected)
		assert.Empty(t, d.errs, "settling errors")
	}
}
