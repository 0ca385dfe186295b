package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A broker is the publisher's and the operator's side of a queue of the
// story's own: it publishes, says whether everything published has been
// settled, and deletes the queue at the end.
type broker interface {
	// publish publishes an event: stored once each call, as a publisher
	// that sends an event again (after a timeout) stores it again.
	publish(id string, body []byte) error
	// settled reports whether the queue holds nothing undelivered and,
	// while a worker consumes, nothing unacked.
	settled() (bool, error)
	url() string
	queue() string
	close()
}

func openBroker(kind string) (broker, error) {
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := "idem-consumer-" + hex.EncodeToString(r[:])
	switch kind {
	case "nats":
		return openNATS(envOr("IDEM_NATS_URL", "nats://127.0.0.1:4222"), strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	case "rabbitmq":
		return openRabbitMQ(envOr("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), name)
	}
	return nil, fmt.Errorf("unknown broker %q (nats or rabbitmq)", kind)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type natsBroker struct {
	addr, stream string
	nc           *nats.Conn
	js           jetstream.JetStream
	cons         jetstream.Consumer
}

// openNATS makes a stream, with the shortest dedupe window JetStream
// allows, and the durable consumer "worker" the workers share.
func openNATS(addr, stream string) (*natsBroker, error) {
	nc, err := nats.Connect(addr)
	if err != nil {
		return nil, err
	}
	b := &natsBroker{addr: addr, stream: stream, nc: nc}
	ctx := context.Background()
	if b.js, err = jetstream.New(nc); err == nil {
		_, err = b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream}, Duplicates: 100 * time.Millisecond})
	}
	if err == nil {
		b.cons, err = b.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second, MaxAckPending: 64,
		})
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// publish waits out the dedupe window for an ID sent before: JetStream
// drops a publish of an ID within it, and the story wants the repeat.
func (b *natsBroker) publish(id string, body []byte) error {
	for {
		ack, err := b.js.Publish(context.Background(), b.stream, body, jetstream.WithMsgID(id))
		if err != nil || !ack.Duplicate {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *natsBroker) settled() (bool, error) {
	info, err := b.cons.Info(context.Background())
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

func (b *natsBroker) url() string   { return b.addr }
func (b *natsBroker) queue() string { return b.stream }
func (b *natsBroker) close() {
	if b.js != nil {
		_ = b.js.DeleteStream(context.Background(), b.stream)
	}
	b.nc.Close()
}

type rabbitBroker struct {
	addr, name string
	conn       *amqp.Connection
	ch         *amqp.Channel
}

func openRabbitMQ(addr, name string) (*rabbitBroker, error) {
	conn, err := amqp.Dial(addr)
	if err != nil {
		return nil, err
	}
	b := &rabbitBroker{addr: addr, name: name, conn: conn}
	if b.ch, err = conn.Channel(); err == nil {
		_, err = b.ch.QueueDeclare(name, true, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return b, nil
}

func (b *rabbitBroker) publish(id string, body []byte) error {
	return b.ch.PublishWithContext(context.Background(), "", b.name, false, false,
		amqp.Publishing{MessageId: id, Body: body, DeliveryMode: amqp.Persistent})
}

// settled looks at the queue and its retry queues: a message delivered
// and not acked is not counted, so it says so only once no worker holds
// one (killed: RabbitMQ has put its deliveries back).
func (b *rabbitBroker) settled() (bool, error) {
	for _, q := range append([]string{b.name}, b.retryQueues()...) {
		n, err := b.ready(q)
		if err != nil || n > 0 {
			return false, err
		}
	}
	return true, nil
}

// retryQueues are the worker's retry queues: its delays are 100 ms.
func (b *rabbitBroker) retryQueues() []string { return []string{b.name + ".retry.100"} }

// ready is how many messages q holds ready, 0 if it does not exist. On a
// channel of its own: declaring an absent queue closes the channel.
func (b *rabbitBroker) ready(q string) (int, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return 0, err
	}
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	_ = ch.Close()
	return info.Messages, nil
}

func (b *rabbitBroker) url() string   { return b.addr }
func (b *rabbitBroker) queue() string { return b.name }
func (b *rabbitBroker) close() {
	for _, q := range append([]string{b.name}, b.retryQueues()...) {
		_, _ = b.ch.QueueDelete(q, false, false, false)
	}
	b.conn.Close()
}
