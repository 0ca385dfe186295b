package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// How handle settles each decision, with a settler that records it: no
// broker needed.

type recordingSettler struct {
	mu  sync.Mutex
	got []string
}

func (r *recordingSettler) note(s string) error {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
	return nil
}
func (r *recordingSettler) ack(amqp.Delivery) error { return r.note("ack") }
func (r *recordingSettler) reject(_ amqp.Delivery, deadLetter bool) error {
	if deadLetter {
		return r.note("dead-letter")
	}
	return r.note("reject")
}
func (r *recordingSettler) retry(_ context.Context, _ amqp.Delivery, delay time.Duration) error {
	return r.note(fmt.Sprint("retry ", delay))
}

func (r *recordingSettler) settles() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// memConsumer is a Consumer over a store of its own, on an in-memory
// backend; its queue is "q" unless opts names one.
func memConsumer(t *testing.T, qopts idemqueue.Options, opts Options) *Consumer[int] {
	t.Helper()
	s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend()})
	t.Cleanup(func() { s.Close() })
	q, err := idemqueue.New(s, qopts)
	require.NoError(t, err)
	if opts.Queue == "" {
		opts.Queue = "q"
	}
	c, err := New(q, opts)
	require.NoError(t, err)
	return c
}

// A panic in Options.Payload (a bug a fixed deploy may not have) does not
// escape handle, which Run calls on a goroutine of its own: the delivery
// is retried.
func TestPayloadPanicIsRetried(t *testing.T) {
	c := memConsumer(t, idemqueue.Options{RetryDelay: 3 * time.Second}, Options{Payload: func(amqp.Delivery) any { panic("bad payload decoder") }})
	s := &recordingSettler{}
	d := amqp.Delivery{MessageId: "m1", Body: []byte("body")}
	fn := func(context.Context, amqp.Delivery) (int, error) { return 1, nil }
	assert.NotPanics(t, func() { _, _ = c.handle(context.Background(), s, d, c.handler(d, fn)) })
	assert.Equal(t, []string{"retry 3s"}, s.settles())
}

// A delivery without a MessageId, or whose Options.Key fails, is held:
// dead-lettered with DeadLetter, else retried after InterruptedDelay;
// never acked. A handler's error that wraps a store's refusal is retried
// after RetryDelay, Run's or RunTx's alike.
func TestHeldAndHandlerFailuresAreNeverAcked(t *testing.T) {
	qopts := idemqueue.Options{RetryDelay: 3 * time.Second, InterruptedDelay: 9 * time.Second}
	noKey := func(amqp.Delivery) (string, error) { return "", errors.New("no order id") }
	ran := func(context.Context, amqp.Delivery) (int, error) { t.Error("ran"); return 0, nil }
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no id", Options{}, "retry 9s"},
		{"no id, DeadLetter", Options{DeadLetter: true}, "dead-letter"},
		{"the key function's error", Options{Key: noKey}, "retry 9s"},
		{"the key function's error, DeadLetter", Options{Key: noKey, DeadLetter: true}, "dead-letter"},
	} {
		c := memConsumer(t, qopts, tc.opts)
		d := amqp.Delivery{Body: []byte("body")}
		s := &recordingSettler{}
		dec, err := c.handle(context.Background(), s, d, c.handler(d, ran))
		require.NoError(t, err)
		assert.Equal(t, idemqueue.Hold, dec.Action, tc.name)
		assert.ErrorIs(t, dec.Err, idem.ErrInvalidKey, tc.name)
		assert.Equal(t, []string{tc.want}, s.settles(), tc.name)
	}

	c := memConsumer(t, qopts, Options{DeadLetter: true})
	downstream := fmt.Errorf("calling the ledger: %w", idem.ErrPayloadMismatch)
	d := amqp.Delivery{MessageId: "m1", Body: []byte("body")}
	s := &recordingSettler{}
	_, err := c.handle(context.Background(), s, d, c.handler(d, func(context.Context, amqp.Delivery) (int, error) { return 0, downstream }))
	require.NoError(t, err)
	_, err = c.handle(context.Background(), s, d, c.caller(func(context.Context, string, any) error { return downstream }))
	require.NoError(t, err)
	assert.Equal(t, []string{"retry 3s", "retry 3s"}, s.settles(), "a handler's failure")
}
