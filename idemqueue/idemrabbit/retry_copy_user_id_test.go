package idemrabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A message published with a user_id (which RabbitMQ checks against the
// publishing connection's user) by a producer other than the consumer's
// user is retried through its retry queue like any other: the copy the
// consumer publishes does not claim the producer's user_id, which the
// broker refuses with PRECONDITION_FAILED, closing the publishing channel
// (every retry of such a message ended the session, and the delivery was
// put back at once instead of after its delay). The handler sees the
// original's user_id on every delivery.
func TestRetryOfAMessageFromAnotherUserKeepsTheSession(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	var r [4]byte
	_, _ = rand.Read(r[:])
	user, pass := "idemtest-producer-"+hex.EncodeToString(r[:]), "secret"
	rabbitmqctl(t, "add_user", user, pass)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })
	rabbitmqctl(t, "set_permissions", user, ".*", ".*", ".*")
	u, err := url.Parse(br.url)
	require.NoError(t, err)
	own := u.User.Username() // the consumer's user
	u.User = url.UserPassword(user, pass)

	rec := newDecisions()
	c := memConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond}, Options{Queue: br.queue, Declare: true, Report: rec.report})
	var failed, ownFailed atomic.Bool
	users := make(chan string, 4)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			users <- d.UserId
			if d.MessageId == "m2" && ownFailed.CompareAndSwap(false, true) || d.MessageId == "m1" && failed.CompareAndSwap(false, true) {
				return 0, errors.New("transient")
			}
			return 1, nil
		})
	}()
	defer func() { stop(); <-ran }()
	br.declared(t)

	producer, err := amqp.Dial(u.String())
	require.NoError(t, err)
	defer producer.Close()
	ch, err := producer.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", br.queue, false, false,
		amqp.Publishing{MessageId: "m1", UserId: user, Body: []byte("body"), DeliveryMode: amqp.Persistent}))

	rec.waitFor(t, "m1", 2)
	assert.Equal(t, []idemqueue.Action{idemqueue.Retry, idemqueue.Ack}, rec.of("m1"))
	rec.mu.Lock()
	assert.Empty(t, rec.errs, "the retry copy was refused")
	assert.True(t, rec.dead["m1"], "the second delivery came from the retry queue, after its delay")
	rec.mu.Unlock()
	br.mu.Lock()
	assert.Len(t, br.conns, 1, "the session ended")
	br.mu.Unlock()
	assert.Equal(t, user, <-users, "the first delivery carries the producer's user_id")
	assert.Equal(t, user, <-users, "the retried delivery carries the original's user_id")

	// So does a message of the consumer's own user.
	require.NoError(t, br.ch.PublishWithContext(context.Background(), "", br.queue, false, false,
		amqp.Publishing{MessageId: "m2", UserId: own, Body: []byte("body"), DeliveryMode: amqp.Persistent}))
	rec.waitFor(t, "m2", 2)
	assert.Equal(t, own, <-users)
	assert.Equal(t, own, <-users, "the retried copy keeps the consumer's own user_id")
}
