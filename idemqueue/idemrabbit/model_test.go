package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"pgregory.net/rapid"
)

// modelBroker is a settler over a model queue: what it does not ack or
// reject goes back to the queue, as RabbitMQ redelivers what a consumer
// did not settle.
type modelBroker struct {
	queue    []amqp.Delivery
	acked    map[string]int
	rejected map[string]int
	parked   int  // retried deliveries without an id: an operator's, delivered no more here
	fail     bool // the next settle fails: the connection is lost with it
}

func (m *modelBroker) settle(d amqp.Delivery, done map[string]int) error {
	if m.fail {
		m.fail = false
		m.queue = append(m.queue, d) // unacked on a closed channel: redelivered
		return errors.New("amqp: connection closed")
	}
	done[d.MessageId]++
	return nil
}
func (m *modelBroker) ack(d amqp.Delivery) error { return m.settle(d, m.acked) }
func (m *modelBroker) reject(d amqp.Delivery, _ bool) error {
	return m.settle(d, m.rejected)
}
func (m *modelBroker) retry(_ context.Context, d amqp.Delivery, _ time.Duration) error {
	if m.fail {
		m.fail = false
		m.queue = append(m.queue, d)
		return errors.New("amqp: connection closed")
	}
	if d.MessageId == "" {
		// It would come back after its delay, and be held again, for
		// ever: the model leaves it in its retry queue, for an operator.
		m.parked++
		return nil
	}
	m.queue = append(m.queue, d) // the copy, back from the retry queue
	return nil
}

// TestConsumerModel drives the adapter's handling with a random broker:
// messages published once or twice, delivered in any order; handlers that
// succeed, fail, fail for good, panic, or die (the process killed before
// or after the remote effect, its claim left interrupted, a new process
// started; or fail with an error that wraps a store's refusal, from a
// call made downstream); settles lost with the connection, and their
// deliveries handed out again; messages without a MessageId (a
// publisher's bug). Invariants: no message's effect happens twice, ever;
// at the end every message with an id is acked with its effect once, or
// rejected with none after a final failure; every message without one is
// still with the broker (a retry queue), never acked nor rejected.
func TestConsumerModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := idemtest.NewMemoryBackend()
		effects := map[string]int{}
		var dead []*idem.Ticket[int]
		var stores []*idem.Store[int]
		defer func() {
			for _, tk := range dead {
				tk.Release()
			}
			for _, s := range stores {
				s.Close()
			}
		}()
		var c *Consumer[int]
		start := func() {
			s := idem.New[int](idem.Options{Backend: b})
			stores = append(stores, s)
			q, err := idemqueue.New(s, idemqueue.Options{Reconcile: func(ctx context.Context, key string, _ error) idemqueue.Decision {
				if effects[key] > 0 {
					if err := s.Resolve(ctx, key, effects[key], nil); err != nil {
						return idemqueue.Decision{Action: idemqueue.Retry, Err: err}
					}
				} else if err := s.Forget(ctx, key); err != nil {
					return idemqueue.Decision{Action: idemqueue.Retry, Err: err}
				}
				return idemqueue.Decision{Action: idemqueue.Retry}
			}})
			if err != nil {
				rt.Fatal(err)
			}
			if c, err = New(q, Options{Queue: "q"}); err != nil {
				rt.Fatal(err)
			}
		}
		start()
		m := &modelBroker{acked: map[string]int{}, rejected: map[string]int{}}
		n := rapid.IntRange(1, 8).Draw(rt, "messages")
		noID := 0                   // deliveries without an id published
		withID := map[string]bool{} // the ids published
		for i := range n {
			d := amqp.Delivery{MessageId: fmt.Sprint("msg-", i), Body: []byte("body")}
			if rapid.IntRange(0, 5).Draw(rt, "no id") == 0 {
				d.MessageId = ""
			}
			m.queue = append(m.queue, d)
			if rapid.IntRange(0, 4).Draw(rt, "duplicate") == 0 {
				m.queue = append(m.queue, d)
			}
		}
		for _, d := range m.queue {
			if d.MessageId == "" {
				noID++
			}
			withID[d.MessageId] = d.MessageId != ""
		}
		final := map[string]bool{}
		ctx := context.Background()
		for attempt := 0; len(m.queue) > 0; attempt++ {
			if attempt > 400 {
				rt.Fatalf("messages never settle: %d left", len(m.queue))
			}
			i := rapid.IntRange(0, len(m.queue)-1).Draw(rt, "deliver")
			d := m.queue[i]
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
			id := d.MessageId
			what := "ok"
			if attempt < 200 {
				what = rapid.SampledFrom([]string{"ok", "ok", "fail", "refused-downstream", "final", "panic", "kill-before", "kill-after", "lost-settle"}).Draw(rt, "handler")
			}
			if id == "" && (what == "kill-before" || what == "kill-after") {
				what = "ok" // no key to die holding
			}
			if what == "kill-before" || what == "kill-after" {
				tk, err := c.q.Store().Begin(ctx, id, d.Body)
				if err == nil && !tk.Replayed() {
					if what == "kill-after" {
						effects[id]++
					}
					dead = append(dead, tk)
					b.Crash()
					start()
				}
				m.queue = append(m.queue, d) // unacked: redelivered
				continue
			}
			m.fail = what == "lost-settle"
			_, _ = c.handle(ctx, m, d, c.handler(d, func(context.Context, amqp.Delivery) (int, error) {
				switch what {
				case "fail":
					return 0, errors.New("transient")
				case "refused-downstream":
					return 0, fmt.Errorf("calling the ledger: %w", idem.ErrPayloadMismatch)
				case "final":
					final[id] = true
					return 0, idem.Final(errors.New("declined"))
				case "panic":
					panic("bug")
				}
				effects[id]++
				return effects[id], nil
			}))
			m.fail = false
			if effects[id] > 1 {
				rt.Fatalf("%s: effect applied %d times", id, effects[id])
			}
		}
		if m.acked[""] > 0 || m.rejected[""] > 0 || effects[""] > 0 || m.parked != noID {
			rt.Fatalf("%d deliveries without an id: %d acked, %d rejected, %d left with the broker, effect applied %d times",
				noID, m.acked[""], m.rejected[""], m.parked, effects[""])
		}
		for i := range n {
			id := fmt.Sprint("msg-", i)
			if !withID[id] {
				continue // published without one
			}
			switch {
			case m.acked[id] > 0 && m.rejected[id] > 0:
				rt.Fatalf("%s: both acked and rejected", id)
			case m.acked[id] > 0 && effects[id] != 1:
				rt.Fatalf("%s: acked with its effect applied %d times", id, effects[id])
			case m.rejected[id] > 0 && (effects[id] != 0 || !final[id]):
				rt.Fatalf("%s: rejected (final %v) with its effect applied %d times", id, final[id], effects[id])
			case m.acked[id] == 0 && m.rejected[id] == 0:
				rt.Fatalf("%s: never settled", id)
			}
		}
	})
}
