package idemnats

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// Issue 24: with 16 messages in flight, idem costs at most one local
// commit a message, here through the adapter and a real JetStream
// server, whose deliveries arrive as the acks free the consumer's slots.
// A message is two writes, its claim and its outcome; bolt's group commit
// lets the writes of the messages in flight share commits. Commits are
// counted by bbolt's transaction id, which every committed write
// transaction raises by one.
func TestAtMostOneCommitPerMessageOverJetStream(t *testing.T) {
	const inFlight, messages = 16, 500
	s := newStream(t, 30*time.Second)
	cons, err := s.js.CreateOrUpdateConsumer(context.Background(), s.name, jetstream.ConsumerConfig{
		Durable: "commits", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: inFlight,
	})
	require.NoError(t, err)
	for i := range messages {
		s.publish(t, fmt.Sprintf("msg-%04d", i), "body", 1)
	}

	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	defer b.Close()
	store := idem.New[int](idem.Options{Backend: b})
	defer store.Close()
	q, err := idemqueue.New(store, idemqueue.Options{})
	require.NoError(t, err)
	c, err := New(q, Options{})
	require.NoError(t, err)
	txID := func() int64 {
		var id int
		require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error { id = tx.ID(); return nil }))
		return int64(id)
	}
	before := txID()

	// Consume calls back one message at a time: inFlight workers take
	// them, as many as the server lets be unacked.
	msgs, done := make(chan jetstream.Msg), make(chan struct{})
	acked := make(chan struct{}, messages)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	for range inFlight {
		wg.Go(func() {
			for {
				select {
				case msg := <-msgs:
					d, err := c.Handle(context.Background(), msg, func(context.Context, jetstream.Msg) (int, error) { return 1, nil })
					if assert.NoError(t, err) && assert.Equal(t, idemqueue.Ack, d.Action, "%v", d.Err) {
						acked <- struct{}{}
					}
				case <-done:
					return
				}
			}
		})
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case msgs <- msg:
		case <-done:
		}
	})
	require.NoError(t, err)
	defer cc.Stop()
	timeout := time.After(time.Minute)
	for range messages {
		select {
		case <-acked:
		case <-timeout:
			t.Fatal("not every message was acked within a minute")
		}
	}
	commits := txID() - before
	t.Logf("%d commits for %d messages, %d in flight: %.3f a message", commits, messages, inFlight, float64(commits)/messages)
	assert.LessOrEqual(t, commits, int64(messages), "more than one commit a message")
	// Each message in flight waits for one write at a time, so no
	// commit holds more than inFlight writes.
	assert.GreaterOrEqual(t, commits, int64(2*messages/inFlight), "fewer commits than the writes need: the count misses some")
}
