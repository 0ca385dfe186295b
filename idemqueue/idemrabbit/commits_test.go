package idemrabbit

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// Issue 24: with 16 messages in flight, idem costs at most one local
// commit a message, here through Run and a real RabbitMQ broker with a
// prefetch of 16. A message is two writes, its claim and its outcome;
// bolt's group commit lets the writes of the messages in flight share
// commits. Commits are counted by bbolt's transaction id, which every
// committed write transaction raises by one.
func TestAtMostOneCommitPerMessageOverRabbitMQ(t *testing.T) {
	const inFlight, messages = 16, 500
	br := newBroker(t)
	_, err := br.ch.QueueDeclare(br.queue, true, false, false, false, nil) // as Declare would: filled before Run
	require.NoError(t, err)
	for i := range messages {
		br.publish(t, fmt.Sprintf("msg-%04d", i), "body")
	}

	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	defer b.Close()
	store := idem.New[int](idem.Options{Backend: b})
	defer store.Close()
	q, err := idemqueue.New(store, idemqueue.Options{})
	require.NoError(t, err)
	txID := func() int64 {
		var id int
		require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error { id = tx.ID(); return nil }))
		return int64(id)
	}
	before := txID()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var acked atomic.Int64
	allAcked := make(chan struct{})
	c, err := New(q, Options{Queue: br.queue, Prefetch: inFlight, Report: func(d amqp.Delivery, dec idemqueue.Decision, err error) {
		if assert.NoError(t, err) && assert.Equal(t, idemqueue.Ack, dec.Action, "%v", dec.Err) && acked.Add(1) == messages {
			close(allAcked)
		}
	}})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(context.Context, amqp.Delivery) (int, error) { return 1, nil })
	}()
	select {
	case <-allAcked:
	case <-ctx.Done():
		t.Fatalf("%d of %d messages acked within a minute", acked.Load(), messages)
	}
	commits := txID() - before
	cancel()
	require.ErrorIs(t, <-ran, context.Canceled)

	t.Logf("%d commits for %d messages, %d in flight: %.3f a message", commits, messages, inFlight, float64(commits)/messages)
	assert.LessOrEqual(t, commits, int64(messages), "more than one commit a message")
	// Each message in flight waits for one write at a time, so no
	// commit holds more than inFlight writes.
	assert.GreaterOrEqual(t, commits, int64(2*messages/inFlight), "fewer commits than the writes need: the count misses some")
}
