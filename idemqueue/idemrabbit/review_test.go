package idemrabbit

import (
	"context"
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
func (r *recordingSettler) ack(amqp.Delivery) error          { return r.note("ack") }
func (r *recordingSettler) reject(amqp.Delivery, bool) error { return r.note("reject") }
func (r *recordingSettler) retry(context.Context, amqp.Delivery, time.Duration) error {
	return r.note("retry")
}

func attackConsumer(t *testing.T, qopts idemqueue.Options, opts Options) *Consumer[int] {
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

// Options.Payload panicking escapes handle, which Run calls on a goroutine
// of its own: the process crashes. (Options.Key is guarded.)
func TestReviewPayloadPanicEscapesRun(t *testing.T) {
	c := attackConsumer(t, idemqueue.Options{}, Options{Payload: func(amqp.Delivery) any { panic("bad payload decoder") }})
	s := &recordingSettler{}
	d := amqp.Delivery{MessageId: "m1", Body: []byte("body")}
	fn := func(context.Context, amqp.Delivery) (int, error) { return 1, nil }
	assert.NotPanics(t, func() { _, _ = c.handle(context.Background(), s, d, c.handler(d, fn)) })
	assert.NotEmpty(t, s.got, "the delivery settled")
}

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// ends Run's handler goroutine before the delivery is settled: on a live
// channel it stays unacked for good, holding a prefetch slot at the
// broker. With Prefetch 1 the consumer stalls: nothing else is delivered.
func TestReviewHandlerGoexitLeavesDeliveryUnackedAndStallsRun(t *testing.T) {
	br := newBroker(t, time.Second)
	c := attackConsumer(t, idemqueue.Options{}, Options{Queue: br.queue, Declare: true, Prefetch: 1})
	var exited atomic.Bool
	handled := make(chan string, 10)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			if d.MessageId == "m1" && exited.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
			handled <- d.MessageId
			return 1, nil
		})
	}()
	defer func() { stop(); <-ran }()
	br.declared(t)
	br.publish(t, "m1", "body")
	br.publish(t, "m2", "body")
	select {
	case id := <-handled:
		t.Logf("handled %s", id)
	case <-time.After(5 * time.Second):
		t.Fatal("after a handler's Goexit nothing more is delivered: m1 is unacked on a live channel, m2 waits behind it")
	}
}

// rabbitmqctl runs rabbitmqctl, skipping the test if it is absent.
func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		svctest.Skipf(t, "rabbitmqctl %v: %v: %s", args, err, out)
	}
}

// When the broker refuses the retry copy (here a policy: max-length 0,
// overflow reject-publish on the retry queues), retry returns an error and
// leaves the original delivery unacked on the live channel: it is never
// redelivered while the session lives, and with Prefetch 1 the consumer
// stalls for good.
func TestReviewRefusedRetryCopyLeavesDeliveryUnacked(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	policy := strings.ReplaceAll(br.queue, ".", "-") + "-attack"
	rabbitmqctl(t, "set_policy", policy, "^"+strings.ReplaceAll(br.queue, ".", `\.`)+`\.retry\.`,
		`{"max-length":0,"overflow":"reject-publish"}`, "--apply-to", "queues")
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "clear_policy", policy).Run() })
	rec := newDecisions()
	c := attackConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond},
		Options{Queue: br.queue, Declare: true, Prefetch: 1, Report: rec.report})
	var failed atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			if d.MessageId == "m1" && failed.CompareAndSwap(false, true) {
				return 0, errors.New("transient")
			}
			return 1, nil
		})
	}()
	defer func() { stop(); <-ran }()
	br.declared(t)
	br.publish(t, "m1", "body")
	rec.waitFor(t, "m1", 1)
	rec.mu.Lock()
	t.Logf("m1's settle error: %v", rec.errs)
	rec.mu.Unlock()
	br.publish(t, "m2", "body")
	time.Sleep(3 * time.Second)
	assert.NotEmpty(t, rec.of("m2"), "m2 never delivered: m1 holds the only prefetch slot, unacked")
	assert.GreaterOrEqual(t, len(rec.of("m1")), 2, "m1 never retried")
}

// A delay RabbitMQ cannot hold in x-expires (RabbitMQ 3.10 refuses
// somewhere between 1000 and 12725 days; here 100 years, what a Reconcile
// or an InterruptedDelay meaning "park it for an operator" may say) makes
// the retry queue's declare fail with PRECONDITION_FAILED, which closes
// the publish channel: the session ends, every unacked delivery is
// requeued at once, redelivered, retried, and the session ends again:
// a hot reconnect/redelivery loop every ~100 ms, with no error surfaced.
func TestReviewHugeRetryDelayLoopsHot(t *testing.T) {
	const delay = 100 * 365 * 24 * time.Hour
	br := newBroker(t, delay)
	var handled atomic.Int32
	var mu sync.Mutex
	var errs []string
	c := attackConsumer(t, idemqueue.Options{RetryDelay: delay}, Options{Queue: br.queue, Declare: true,
		Report: func(_ amqp.Delivery, _ idemqueue.Decision, err error) {
			if err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
			}
		}})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(context.Context, amqp.Delivery) (int, error) {
			handled.Add(1)
			return 0, errors.New("transient")
		})
	}()
	br.declared(t)
	br.publish(t, "m1", "body")
	time.Sleep(2 * time.Second)
	stop()
	<-ran
	br.mu.Lock()
	dials := len(br.conns)
	br.mu.Unlock()
	mu.Lock()
	t.Logf("in 2 s: %d handler runs, %d dials; first error: %v", handled.Load(), dials, errs[:min(1, len(errs))])
	mu.Unlock()
	assert.LessOrEqual(t, handled.Load(), int32(2), "a retry must not loop hot")
}

// The retry copy goes to the retry queue through the default exchange and
// comes back dead-lettered with the queue's name as its routing key: the
// original Exchange and RoutingKey are gone. A handler (or Options.Key or
// Payload) that looks at them, as one queue bound to several routing keys
// does, treats every retried delivery as another message.
func TestReviewRetriedDeliveryLosesItsRoutingKey(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	ex := br.queue + ".ex"
	require.NoError(t, br.ch.ExchangeDeclare(ex, "direct", false, true, false, false, nil))
	t.Cleanup(func() { _ = br.ch.ExchangeDelete(ex, false, false) })
	rec := newDecisions()
	c := attackConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond}, Options{Queue: br.queue, Declare: true, Report: rec.report})
	var mu sync.Mutex
	var seen []string
	var failed atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			mu.Lock()
			seen = append(seen, d.Exchange+"/"+d.RoutingKey)
			mu.Unlock()
			if failed.CompareAndSwap(false, true) {
				return 0, errors.New("transient")
			}
			return 1, nil
		})
	}()
	defer func() { stop(); <-ran }()
	br.declared(t)
	require.NoError(t, br.ch.QueueBind(br.queue, "order.placed", ex, false, nil))
	require.NoError(t, br.ch.PublishWithContext(context.Background(), ex, "order.placed", false, false,
		amqp.Publishing{MessageId: "m1", Body: []byte("body")}))
	rec.waitFor(t, "m1", 2)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	assert.Equal(t, seen[0], seen[1], "the retried delivery's exchange/routing key")
}

// Found by helper-35: bad input that no reconnect can fix made Run dial
// again every 5 s for ever, saying nothing until ctx ended. New now
// refuses what it can check (a prefetch past AMQP's 65535, a queue name
// whose retry queues' names would pass 255 bytes), and Run ends at once
// with the broker's refusal of the rest: a queue that does not exist
// (Declare false), a Declare whose arguments differ from the queue's.
func TestReviewPermanentSetupErrorEndsRun(t *testing.T) {
	br := newBroker(t)
	_, err := br.ch.QueueDeclare(br.queue, true, false, false, false, nil) // no dead-letter exchange
	require.NoError(t, err)
	q, err := idemqueue.New(idem.New[int](idem.Options{}), idemqueue.Options{})
	require.NoError(t, err)
	for name, opts := range map[string]Options{
		"prefetch 70000": {Queue: br.queue, Prefetch: 70000},
		"long name":      {Queue: br.queue + "." + strings.Repeat("x", 250-len(br.queue)-1)},
	} {
		_, err := New(q, opts)
		assert.Error(t, err, name)
	}
	for name, opts := range map[string]Options{
		"no such queue":       {Queue: br.queue + ".absent"},
		"declare args differ": {Queue: br.queue, Declare: true, DeadLetter: true},
	} {
		c, err := New(q, opts)
		require.NoError(t, err, name)
		ctx, stop := context.WithTimeout(context.Background(), time.Minute)
		err = c.Run(ctx, br.dial, func(context.Context, amqp.Delivery) (int, error) { return 0, nil })
		stop()
		assert.Error(t, err, name)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s: Run went on until ctx ended", name)
	}
}
