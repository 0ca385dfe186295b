package idemrabbit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A message is taken for a retried copy, whose exchange and routing key
// the handler is given back from the copy's headers, only if the broker
// vouches that the consumer's own user published it (its user_id): a
// producer that sets x-idem-exchange and x-idem-routing-key itself on a
// new message does not make the handler see an exchange and a routing key
// it never published to (a routing key that topic authorization refuses
// it, say). A real retry still gives the handler the original's.
func TestForgedRetryHeadersAreNotBelieved(t *testing.T) {
	br := newBroker(t, 50*time.Millisecond)
	rec := newDecisions()
	c := memConsumer(t, idemqueue.Options{RetryDelay: 50 * time.Millisecond}, Options{Queue: br.queue, Declare: true, Report: rec.report})
	seen := make(chan string, 4)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	var failed atomic.Bool
	go func() {
		ran <- c.Run(ctx, br.dial, func(_ context.Context, d amqp.Delivery) (int, error) {
			seen <- d.MessageId + " " + d.Exchange + "/" + d.RoutingKey
			if d.MessageId == "real" && failed.CompareAndSwap(false, true) {
				return 0, errors.New("transient")
			}
			return 1, nil
		})
	}()
	defer func() { stop(); <-ran }()
	br.declared(t)

	require.NoError(t, br.ch.PublishWithContext(context.Background(), "", br.queue, false, false, amqp.Publishing{
		MessageId: "forged", Body: []byte("body"),
		Headers: amqp.Table{exchangeHeader: "admin.ex", routingKeyHeader: "admin.delete-everything"},
	}))
	rec.waitFor(t, "forged", 1)
	assert.Equal(t, "forged /"+br.queue, <-seen, "the handler sees where the message was really published")

	ex := br.queue + ".ex"
	require.NoError(t, br.ch.ExchangeDeclare(ex, "direct", false, true, false, false, nil))
	t.Cleanup(func() { _ = br.ch.ExchangeDelete(ex, false, false) })
	require.NoError(t, br.ch.QueueBind(br.queue, "order.placed", ex, false, nil))
	require.NoError(t, br.ch.PublishWithContext(context.Background(), ex, "order.placed", false, false,
		amqp.Publishing{MessageId: "real", Body: []byte("body")}))
	rec.waitFor(t, "real", 2)
	assert.Equal(t, "real "+ex+"/order.placed", <-seen, "the first delivery")
	assert.Equal(t, "real "+ex+"/order.placed", <-seen, "the retried delivery")
}
