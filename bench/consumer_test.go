package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemqueue/idemnats"
	"github.com/seed094d4201/idem/idemqueue/idemrabbit"
	"github.com/seed094d4201/idem/internal/svctest"
	bbolt "go.etcd.io/bbolt"
)

// The consumer benchmarks (issue 24) need the brokers the adapters' tests
// use; they skip without IDEM_NATS_URL or IDEM_AMQP_URL, and the postgres
// rows without IDEM_POSTGRES_DSN. Each run has its own stream or queue,
// deleted afterwards, filled with b.N messages of distinct ids before the
// timer starts; the timer then runs until every message is settled.

// consumerInFlight is how many messages a consumer holds unacked and
// handles at once: the 16.
const consumerInFlight = 16

// consumerStore is the store a consumer runs its handlers through, and
// for bolt, the count of commits its file has seen (bbolt's transaction
// id: every committed write transaction raises it by one).
type consumerStore struct {
	store   *idem.Store[receipt]
	commits func() int64 // nil: not counted
}

func newConsumerStore(b *testing.B, name string) consumerStore {
	switch name {
	case "bolt":
		be, err := bolt.Open(filepath.Join(b.TempDir(), "idem.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		s := idem.New[receipt](idem.Options{Backend: be})
		b.Cleanup(func() {
			s.Close()
			be.Close()
		})
		return consumerStore{store: s, commits: func() int64 {
			var id int
			if err := be.View(context.Background(), func(tx *bbolt.Tx) error { id = tx.ID(); return nil }); err != nil {
				b.Fatal(err)
			}
			return int64(id)
		}}
	case "postgres":
		s := idem.New[receipt](idem.Options{Backend: pgBackend(b)})
		b.Cleanup(func() { s.Close() })
		return consumerStore{store: s}
	}
	panic("no store " + name)
}

// handled is what a consumer's handler does: nothing much, as a message
// whose work is a small answer.
func handled() (receipt, error) { return fnReceipt, nil }

// consumerRun is one run of a consumer over b.N messages: it reports
// messages per second, and commits per message where they are counted.
func consumerRun(b *testing.B, cs *consumerStore, consume func()) {
	var before int64
	if cs != nil && cs.commits != nil {
		before = cs.commits()
	}
	b.ReportAllocs()
	b.ResetTimer()
	consume()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	if cs != nil && cs.commits != nil {
		b.ReportMetric(float64(cs.commits()-before)/float64(b.N), "commits/msg")
	}
}

// BenchmarkConsumer: messages per second through each broker's adapter
// over a bolt or a postgres store (impl=idem), against the same consumer
// that runs the handler and acks without idem (impl=bare), with 16
// messages in flight. The bare consumer does not depend on the store; it
// is measured beside each store's row so that every ratio compares runs
// made one after the other.
func BenchmarkConsumer(b *testing.B) {
	for _, broker := range []struct {
		name string
		run  func(b *testing.B, store string, bare bool)
	}{
		{"nats", benchJetStream},
		{"rabbitmq", benchRabbitMQ},
	} {
		for _, store := range []string{"bolt", "postgres"} {
			for _, impl := range []string{"idem", "bare"} {
				b.Run(fmt.Sprintf("broker=%s/store=%s/impl=%s", broker.name, store, impl), func(b *testing.B) {
					if store == "postgres" {
						svctest.Postgres(b) // or skip
					}
					broker.run(b, store, impl == "bare")
				})
			}
		}
	}
}

// benchJetStream consumes b.N messages from a stream of its own through
// a durable pull consumer whose MaxAckPending is 16: Consume's callback
// hands each message to one of 16 workers, which handle it through
// idemnats (or run the handler and Ack, bare).
func benchJetStream(b *testing.B, store string, bare bool) {
	url := svctest.NATS(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	name := strings.ToUpper(uniqueName("IDEMBENCH_"))
	subject := strings.ToLower(name)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: consumerInFlight,
	})
	if err != nil {
		b.Fatal(err)
	}
	keys := makeKeys(b.N)
	for i, key := range keys {
		if _, err := js.PublishAsync(subject, payload, jetstream.WithMsgID(key)); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 || i == len(keys)-1 {
			<-js.PublishAsyncComplete()
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != uint64(b.N) {
		b.Fatalf("the stream holds %d messages, not %d", info.State.Msgs, b.N)
	}

	handle := func(msg jetstream.Msg) error {
		if _, err := handled(); err != nil {
			return err
		}
		return msg.Ack()
	}
	var cs *consumerStore
	if !bare {
		s := newConsumerStore(b, store)
		cs = &s
		q, err := idemqueue.New(s.store, idemqueue.Options{})
		if err != nil {
			b.Fatal(err)
		}
		c, err := idemnats.New(q, idemnats.Options{})
		if err != nil {
			b.Fatal(err)
		}
		fn := func(context.Context, jetstream.Msg) (receipt, error) { return handled() }
		handle = func(msg jetstream.Msg) error {
			d, err := c.Handle(ctx, msg, fn)
			if err == nil && d.Action != idemqueue.Ack {
				err = fmt.Errorf("%v: %v", d.Action, d.Err)
			}
			return err
		}
	}

	consumerRun(b, cs, func() {
		msgs, done := make(chan jetstream.Msg), make(chan struct{})
		errs := make(chan error, b.N)
		var wg sync.WaitGroup
		for range consumerInFlight {
			wg.Go(func() {
				for {
					select {
					case msg := <-msgs:
						errs <- handle(msg)
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
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			if err := <-errs; err != nil {
				b.Error(err)
			}
		}
		// The acks were sent without waiting for the server: a flush
		// is the round trip after which it has them all.
		if err := nc.Flush(); err != nil {
			b.Error(err)
		}
		cc.Stop()
		close(done)
		wg.Wait()
	})
}

// benchRabbitMQ consumes b.N messages from a queue of its own with a
// prefetch of 16: through idemrabbit's Run, or, bare, through the same
// loop Run has (one goroutine a delivery, at most 16 at once) that runs
// the handler and acks.
func benchRabbitMQ(b *testing.B, store string, bare bool) {
	url := svctest.AMQP(b)
	admin, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { admin.Close() })
	ch, err := admin.Channel()
	if err != nil {
		b.Fatal(err)
	}
	queue := uniqueName("idembench.")
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	// Published with confirms: every message is in the queue before the
	// timer starts.
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var confirms []*amqp.DeferredConfirmation
	for _, key := range makeKeys(b.N) {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp.Publishing{MessageId: key, Body: payload, DeliveryMode: amqp.Persistent})
		if err != nil {
			b.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			b.Fatalf("a message was not confirmed: %v", err)
		}
	}
	// Dialed before the timer, for both: the runs time the consuming.
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })

	if bare {
		consumerRun(b, nil, func() { bareRabbitMQ(b, conn, queue) })
		return
	}
	s := newConsumerStore(b, store)
	q, err := idemqueue.New(s.store, idemqueue.Options{})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	settled := 0
	all := make(chan struct{})
	c, err := idemrabbit.New(q, idemrabbit.Options{Queue: queue, Prefetch: consumerInFlight,
		Report: func(_ amqp.Delivery, d idemqueue.Decision, err error) {
			if err == nil && d.Action != idemqueue.Ack {
				err = fmt.Errorf("%v: %v", d.Action, d.Err)
			}
			if err != nil {
				b.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if settled++; settled == b.N {
				close(all)
			}
		}})
	if err != nil {
		b.Fatal(err)
	}
	// The connection dialed before the timer first; a session that
	// ended (it should not) dials anew.
	dialed := false
	dial := func(ctx context.Context) (*amqp.Connection, error) {
		if dialed {
			return amqp.Dial(url)
		}
		dialed = true
		return conn, nil
	}
	fn := func(context.Context, amqp.Delivery) (receipt, error) { return handled() }
	ran := make(chan error, 1)
	consumerRun(b, &s, func() {
		go func() { ran <- c.Run(runCtx, dial, fn) }()
		<-all
	})
	stop()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		b.Errorf("Run ended with %v", err)
	}
}

// bareRabbitMQ consumes queue's b.N messages as idemrabbit's session does,
// without idem: manual acks, a prefetch of 16, a goroutine a delivery
// while fewer than 16 run.
func bareRabbitMQ(b *testing.B, conn *amqp.Connection, queue string) {
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(consumerInFlight, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	slots := make(chan struct{}, consumerInFlight)
	var wg sync.WaitGroup
	for range b.N {
		d := <-deliveries
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if _, err := handled(); err != nil {
				b.Error(err)
			}
			if err := d.Ack(false); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}
