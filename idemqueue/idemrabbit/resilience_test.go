package idemrabbit

import (
	"context"
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run against a real broker when user code, the broker or the settings
// misbehave: every delivery is still settled, and Run neither stalls nor
// loops hot.

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// does not end Run's handler goroutine before the delivery is settled:
// with Prefetch 1, the next message is still delivered.
func TestHandlerGoexitIsSettledAndRunGoesOn(t *testing.T) {
	br := newBroker(t, time.Second)
	c := memConsumer(t, idemqueue.Options{}, Options{Queue: br.queue, Declare: true, Prefetch: 1})
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
	case <-handled:
	case <-time.After(20 * time.Second):
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
// overflow reject-publish on the retry queues), the delivery is put back
// (Nack with requeue) after its delay: it is delivered again, and the
// prefetch slot it held is free for the next message.
func TestRefusedRetryCopyPutsTheDeliveryBack(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	policy := strings.ReplaceAll(br.queue, ".", "-") + "-refuse"
	rabbitmqctl(t, "set_policy", policy, "^"+strings.ReplaceAll(br.queue, ".", `\.`)+`\.retry\.`,
		`{"max-length":0,"overflow":"reject-publish"}`, "--apply-to", "queues")
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "clear_policy", policy).Run() })
	rec := newDecisions()
	c := memConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond},
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
	br.publish(t, "m2", "body")
	rec.waitFor(t, "m2", 1) // m1 does not hold the only prefetch slot
	rec.waitFor(t, "m1", 2) // put back, delivered again
	rec.mu.Lock()
	assert.NotEmpty(t, rec.errs, "the refused copy is reported")
	rec.mu.Unlock()
}

// A delay RabbitMQ cannot hold in x-expires (RabbitMQ 3.10 refuses
// somewhere between 1000 and 12725 days; here 100 years, what a Reconcile
// or an InterruptedDelay meaning "park it for an operator" may say)
// waits seven days: its copy lands in the seven-day retry queue, once,
// instead of a refused declare closing the channel and the delivery
// looping through requeues.
func TestHugeRetryDelayWaitsSevenDays(t *testing.T) {
	const delay = 100 * 365 * 24 * time.Hour
	br := newBroker(t, delay)
	rec := newDecisions()
	var handled atomic.Int32
	c := memConsumer(t, idemqueue.Options{RetryDelay: delay}, Options{Queue: br.queue, Declare: true, Report: rec.report})
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
	rec.waitFor(t, "m1", 1)
	week := retryQueue(br.queue, maxDelay.Milliseconds())
	require.Eventually(t, func() bool { n, err := br.inspect(week); return err == nil && n == 1 }, 10*time.Second, 10*time.Millisecond)
	stop()
	require.ErrorIs(t, <-ran, context.Canceled)
	assert.Equal(t, int32(1), handled.Load(), "a retry must not loop")
	br.mu.Lock()
	assert.Len(t, br.conns, 1, "the session never ended")
	br.mu.Unlock()
	assert.Empty(t, rec.errs)
}

// A retried delivery comes back from its retry queue through the default
// exchange, yet the handler sees the original's exchange and routing key,
// as a queue bound to several routing keys needs.
func TestRetriedDeliveryKeepsItsRoutingKey(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	ex := br.queue + ".ex"
	require.NoError(t, br.ch.ExchangeDeclare(ex, "direct", false, true, false, false, nil))
	t.Cleanup(func() { _ = br.ch.ExchangeDelete(ex, false, false) })
	rec := newDecisions()
	c := memConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond}, Options{Queue: br.queue, Declare: true, Report: rec.report})
	seen := make(chan string, 2)
	var failed atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			seen <- d.Exchange + "/" + d.RoutingKey
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
	assert.Equal(t, ex+"/order.placed", <-seen, "the first delivery")
	assert.Equal(t, ex+"/order.placed", <-seen, "the retried delivery")
}

// Bad settings that no reconnect can fix end Run at once, or New refuses
// them: a prefetch past AMQP's 65535, a queue name whose retry queues'
// names would pass 255 bytes, a queue that does not exist (Declare
// false), a Declare whose arguments differ from the queue's.
func TestPermanentSetupErrorEndsRun(t *testing.T) {
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
