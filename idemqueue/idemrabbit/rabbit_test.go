package idemrabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The decision table against a real RabbitMQ broker: each row's message is
// published to a queue of the test's own, consumed by Run, settled, and
// then seen gone from the broker or delivered again as the row says.

// broker is a test's own queue on the broker IDEM_AMQP_URL names; its
// queues (the retry queues of the delays named, the dead-letter queue) are
// deleted afterwards.
type broker struct {
	url   string
	queue string
	ch    *amqp.Channel // the test's own: publishing, counting

	mu    sync.Mutex
	conns []*amqp.Connection // Run's, newest last
}

func newBroker(t testing.TB, delays ...time.Duration) *broker {
	t.Helper()
	url := svctest.AMQP(t)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	var r [4]byte
	_, _ = rand.Read(r[:])
	b := &broker{url: url, queue: "idemtest." + hex.EncodeToString(r[:]), ch: ch}
	t.Cleanup(func() {
		for _, q := range append([]string{b.queue, b.queue + ".dead"}, retryQueues(b.queue, delays)...) {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return b
}

func retryQueues(queue string, delays []time.Duration) []string {
	var qs []string
	for _, d := range delays {
		qs = append(qs, retryQueue(queue, min(d, maxDelay).Milliseconds())) // the queue retry declares
	}
	return qs
}

// dial is Run's dial: it keeps each connection, for the test to close.
func (b *broker) dial(context.Context) (*amqp.Connection, error) {
	conn, err := amqp.Dial(b.url)
	if err == nil {
		b.mu.Lock()
		b.conns = append(b.conns, conn)
		b.mu.Unlock()
	}
	return conn, err
}

// dropConnection closes Run's current connection, as a broker restart or
// a network failure would.
func (b *broker) dropConnection(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	conn := b.conns[len(b.conns)-1]
	b.mu.Unlock()
	require.NoError(t, conn.Close())
}

func (b *broker) publish(t testing.TB, id, body string) {
	t.Helper()
	require.NoError(t, b.ch.PublishWithContext(context.Background(), "", b.queue, false, false,
		amqp.Publishing{MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent}))
}

// inspect declares q passively on a channel of its own (a queue that is
// absent closes the channel), and returns its ready messages.
func (b *broker) inspect(q string) (int, error) {
	conn, err := amqp.Dial(b.url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	c, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	info, err := c.QueueDeclarePassive(q, true, false, false, false, nil)
	return info.Messages, err
}

// messages is how many messages the queue q holds ready.
func (b *broker) messages(t testing.TB, q string) int {
	t.Helper()
	n, err := b.inspect(q)
	require.NoError(t, err)
	return n
}

// declared waits until Run has declared the queue.
func (b *broker) declared(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool { _, err := b.inspect(b.queue); return err == nil }, 10*time.Second, 10*time.Millisecond)
}

// decisions records each delivery's decision, by message id.
type decisions struct {
	mu    sync.Mutex
	seen  map[string][]idemqueue.Action
	dead  map[string]bool // ids redelivered from a retry queue (x-death)
	errs  []error
	ch    chan string
	block map[string]chan struct{} // handlers to hold until closed
}

func newDecisions() *decisions {
	return &decisions{seen: map[string][]idemqueue.Action{}, dead: map[string]bool{}, ch: make(chan string, 1000), block: map[string]chan struct{}{}}
}

func (r *decisions) report(d amqp.Delivery, dec idemqueue.Decision, err error) {
	r.mu.Lock()
	r.seen[d.MessageId] = append(r.seen[d.MessageId], dec.Action)
	if _, ok := d.Headers["x-death"]; ok {
		r.dead[d.MessageId] = true
	}
	if err != nil {
		r.errs = append(r.errs, err)
	}
	r.mu.Unlock()
	r.ch <- d.MessageId
}

func (r *decisions) of(id string) []idemqueue.Action {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idemqueue.Action(nil), r.seen[id]...)
}

func (r *decisions) waitFor(t testing.TB, id string, n int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for len(r.of(id)) < n {
		select {
		case <-r.ch:
		case <-timeout:
			t.Fatalf("%s decided %v, waiting for %d decisions", id, r.of(id), n)
		}
	}
}

const retryDelay = 50 * time.Millisecond

func TestDecisionTableOverRabbitMQ(t *testing.T) {
	br := newBroker(t, retryDelay)
	mem := idemtest.NewMemoryBackend()

	dead := idem.New[int](idem.Options{Backend: mem}) // died in the handler
	tk, err := dead.Begin(context.Background(), "interrupted", []byte("body"))
	require.NoError(t, err)
	mem.Crash()
	t.Cleanup(func() { tk.Release(); dead.Close() })
	other := idem.New[int](idem.Options{Backend: mem}) // another process, busy
	defer other.Close()
	busy, err := other.Begin(context.Background(), "busy", []byte("body"))
	require.NoError(t, err)
	defer busy.Release() // a no-op once finished; else Close would wait for it

	store := idem.New[int](idem.Options{Backend: mem})
	defer store.Close()
	var reconciles int
	q, err := idemqueue.New(store, idemqueue.Options{
		RetryDelay: retryDelay, BusyDelay: retryDelay, InterruptedDelay: retryDelay, BusyWait: 100 * time.Millisecond,
		Reconcile: func(ctx context.Context, key string, err error) idemqueue.Decision {
			if reconciles++; reconciles == 1 {
				return idemqueue.Decision{Action: idemqueue.Retry, Delay: retryDelay, Err: err}
			}
			if err := store.Resolve(ctx, key, 9, nil); err != nil {
				return idemqueue.Decision{Action: idemqueue.Retry, Delay: retryDelay, Err: err}
			}
			return idemqueue.Decision{Action: idemqueue.Ack}
		},
	})
	require.NoError(t, err)
	rec := newDecisions()
	c, err := New(q, Options{Queue: br.queue, Declare: true, Prefetch: 4, Report: rec.report})
	require.NoError(t, err)

	var mu sync.Mutex
	effects := map[string]int{}
	failed := map[string]bool{}
	fn := func(ctx context.Context, d amqp.Delivery) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		switch d.MessageId {
		case "final":
			return 0, idem.Final(errors.New("card declined"))
		case "transient", "panics":
			if !failed[d.MessageId] {
				failed[d.MessageId] = true
				if d.MessageId == "panics" {
					panic("bug")
				}
				return 0, errors.New("timeout")
			}
		}
		effects[d.MessageId]++
		return effects[d.MessageId], nil
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx, br.dial, fn) }()

	br.declared(t)
	br.publish(t, "ok", "body")
	br.publish(t, "twice", "body")
	br.publish(t, "twice", "body") // no dedupe in RabbitMQ: the publisher sent it twice
	br.publish(t, "final", "body")
	br.publish(t, "transient", "body")
	br.publish(t, "panics", "body")
	br.publish(t, "interrupted", "body")
	br.publish(t, "busy", "body")
	br.publish(t, "ok", "another body")

	rec.waitFor(t, "twice", 2)
	rec.waitFor(t, "transient", 2)
	rec.waitFor(t, "panics", 2)
	rec.waitFor(t, "interrupted", 2)
	rec.waitFor(t, "busy", 1)
	_, err = busy.Finish(5, nil)
	require.NoError(t, err)
	rec.waitFor(t, "ok", 2)
	rec.waitFor(t, "final", 1)
	require.Eventually(t, func() bool {
		a := rec.of("busy")
		return len(a) > 0 && a[len(a)-1] == idemqueue.Ack
	}, 20*time.Second, 10*time.Millisecond)
	stop()
	require.ErrorIs(t, <-ran, context.Canceled)

	A, R, T := idemqueue.Ack, idemqueue.Reject, idemqueue.Retry
	assert.Equal(t, []idemqueue.Action{A, R}, rec.of("ok"), "then another payload: rejected")
	assert.Equal(t, []idemqueue.Action{A, A}, rec.of("twice"))
	assert.Equal(t, []idemqueue.Action{R}, rec.of("final"))
	assert.Equal(t, []idemqueue.Action{T, A}, rec.of("transient"))
	assert.Equal(t, []idemqueue.Action{T, A}, rec.of("panics"))
	assert.Equal(t, []idemqueue.Action{T, A}, rec.of("interrupted"))
	for _, id := range []string{"transient", "panics", "interrupted", "busy"} {
		assert.True(t, rec.dead[id], "%s came back through the retry queue, not a requeue", id)
	}
	mu.Lock()
	assert.Equal(t, map[string]int{"ok": 1, "twice": 1, "transient": 1, "panics": 1}, effects)
	mu.Unlock()
	assert.Empty(t, rec.errs)
	assert.Zero(t, br.messages(t, br.queue), "left in the queue, or unacked")
	assert.Zero(t, br.messages(t, retryQueue(br.queue, retryDelay.Milliseconds())), "left in the retry queue")
}

// With DeadLetter, a rejected delivery goes to the dead-letter queue.
func TestRejectedIsDeadLetteredOverRabbitMQ(t *testing.T) {
	br := newBroker(t)
	store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
	defer store.Close()
	q, err := idemqueue.New(store, idemqueue.Options{})
	require.NoError(t, err)
	rec := newDecisions()
	c, err := New(q, Options{Queue: br.queue, Declare: true, DeadLetter: true, Report: rec.report})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(context.Context, amqp.Delivery) (int, error) {
			return 0, idem.Final(errors.New("card declined"))
		})
	}()
	br.declared(t)
	br.publish(t, "m1", "body")
	rec.waitFor(t, "m1", 1)
	require.Eventually(t, func() bool { return br.messages(t, br.queue+".dead") == 1 }, 10*time.Second, 10*time.Millisecond)
	stop()
	<-ran
	assert.Zero(t, br.messages(t, br.queue))
}

// A delivery without a MessageId (one publisher's bug) is never acked:
// without DeadLetter it comes back through the retry queue after
// InterruptedDelay, again and again, for an operator; with DeadLetter the
// dead-letter queue takes it.
func TestMessageWithoutAnIDIsKeptOverRabbitMQ(t *testing.T) {
	for _, deadLetter := range []bool{false, true} {
		br := newBroker(t, retryDelay)
		store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
		defer store.Close()
		q, err := idemqueue.New(store, idemqueue.Options{InterruptedDelay: retryDelay})
		require.NoError(t, err)
		rec := newDecisions()
		c, err := New(q, Options{Queue: br.queue, Declare: true, DeadLetter: deadLetter, Report: rec.report})
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() {
			ran <- c.Run(ctx, br.dial, func(context.Context, amqp.Delivery) (int, error) {
				t.Error("a delivery without an id ran")
				return 0, nil
			})
		}()
		br.declared(t)
		br.publish(t, "", "no id")
		if deadLetter {
			rec.waitFor(t, "", 1)
			require.Eventually(t, func() bool { return br.messages(t, br.queue+".dead") == 1 }, 10*time.Second, 10*time.Millisecond)
		} else {
			rec.waitFor(t, "", 3) // held, and delivered again, twice
			rec.mu.Lock()
			assert.True(t, rec.dead[""], "it came back through the retry queue")
			rec.mu.Unlock()
		}
		stop()
		require.ErrorIs(t, <-ran, context.Canceled)
		for _, a := range rec.of("") {
			assert.Equal(t, idemqueue.Hold, a, "deadLetter %v", deadLetter)
		}
		assert.Empty(t, rec.errs)
	}
}

// A connection lost mid-handler: the ack fails with it, Run dials again,
// the broker redelivers the message, and the redelivery replays; messages
// published meanwhile are consumed on the new connection.
func TestConnectionLostOverRabbitMQ(t *testing.T) {
	br := newBroker(t)
	store := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
	defer store.Close()
	q, err := idemqueue.New(store, idemqueue.Options{})
	require.NoError(t, err)
	rec := newDecisions()
	c, err := New(q, Options{Queue: br.queue, Declare: true, Report: rec.report})
	require.NoError(t, err)
	var mu sync.Mutex
	effects := map[string]int{}
	inHandler, drop := make(chan struct{}), make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			if d.MessageId == "during" {
				mu.Lock()
				first := effects["during"] == 0
				mu.Unlock()
				if first {
					close(inHandler)
					<-drop // the connection is gone now
				}
			}
			mu.Lock()
			defer mu.Unlock()
			effects[d.MessageId]++
			return effects[d.MessageId], nil
		})
	}()
	br.declared(t)
	br.publish(t, "during", "body")
	<-inHandler
	br.dropConnection(t)
	close(drop)
	br.publish(t, "after", "body")
	rec.waitFor(t, "after", 1)
	rec.waitFor(t, "during", 2)
	stop()
	<-ran
	assert.Equal(t, []idemqueue.Action{idemqueue.Ack, idemqueue.Ack}, rec.of("during"), "the first ack lost, the redelivery replayed")
	rec.mu.Lock()
	assert.NotEmpty(t, rec.errs, "the lost ack was reported")
	rec.mu.Unlock()
	mu.Lock()
	assert.Equal(t, map[string]int{"during": 1, "after": 1}, effects)
	mu.Unlock()
	br.mu.Lock()
	assert.GreaterOrEqual(t, len(br.conns), 2, "dialed again")
	br.mu.Unlock()
	assert.Zero(t, br.messages(t, br.queue))
}
