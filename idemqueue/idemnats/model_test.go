package idemnats

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/idemtest"
	"pgregory.net/rapid"
)

// TestConsumerModel drives Handle with a random JetStream: messages
// published once or twice (after the dedupe window), delivered in any
// order; handlers that succeed, fail, fail for good, panic, or die (the
// process killed before or after the remote effect, its claim left
// interrupted, a new process started); acks and naks lost with the
// connection, and the message redelivered after AckWait; handlers that
// fail with an error that wraps a store's refusal (from a call made
// downstream); messages without a Nats-Msg-Id (a publisher's bug).
// Invariants: no message's effect happens twice, ever; at the end every
// message with an id is acked with its effect once, or terminated with
// none after a final failure; every message without one is held: naked
// for a later delivery (never terminated, which deletes a message from a
// work-queue stream), never acked, its handler never run.
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
			if c, err = New(q, Options{ProgressInterval: -1}); err != nil {
				rt.Fatal(err)
			}
		}
		start()
		var queue []string // message ids, one per message the stream holds
		n := rapid.IntRange(1, 8).Draw(rt, "messages")
		noID, withID := 0, map[string]bool{}
		for i := range n {
			id := fmt.Sprint("msg-", i)
			if rapid.IntRange(0, 5).Draw(rt, "no id") == 0 {
				id = ""
			}
			withID[id] = id != ""
			queue = append(queue, id)
			if rapid.IntRange(0, 4).Draw(rt, "duplicate") == 0 {
				queue = append(queue, id)
			}
		}
		for _, id := range queue {
			if id == "" {
				noID++
			}
		}
		final := map[string]bool{}
		acked, termed, held := map[string]int{}, map[string]int{}, map[string]int{}
		ctx := context.Background()
		for attempt := 0; len(queue) > 0; attempt++ {
			if attempt > 400 {
				rt.Fatalf("messages never settle: %v", queue)
			}
			i := rapid.IntRange(0, len(queue)-1).Draw(rt, "deliver")
			id := queue[i]
			queue = append(queue[:i], queue[i+1:]...)
			what := "ok"
			if attempt < 200 {
				what = rapid.SampledFrom([]string{"ok", "ok", "fail", "refused-downstream", "final", "panic", "kill-before", "kill-after", "lost-settle"}).Draw(rt, "handler")
			}
			if id == "" && (what == "kill-before" || what == "kill-after") {
				what = "ok" // no key to die holding
			}
			if what == "kill-before" || what == "kill-after" {
				tk, err := c.q.Store().Begin(ctx, id, []byte("body"))
				if err == nil && !tk.Replayed() {
					if what == "kill-after" {
						effects[id]++
					}
					dead = append(dead, tk)
					b.Crash()
					start()
				}
				queue = append(queue, id) // unacked: redelivered after AckWait
				continue
			}
			msg := newMsg(id, "body")
			if what == "lost-settle" {
				msg.failSettle = errors.New("nats: connection closed")
			}
			d, err := c.Handle(ctx, msg, func(context.Context, jetstream.Msg) (int, error) {
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
			})
			if effects[id] > 1 {
				rt.Fatalf("%s: effect applied %d times", id, effects[id])
			}
			settles, _ := msg.got()
			switch {
			case len(settles) != 1:
				rt.Fatalf("%s: settled %v", id, settles)
			case err == nil && d.Action == idemqueue.Hold:
				if settles[0] != "nak" {
					rt.Fatalf("%q: held with %v", id, settles)
				}
				held[id]++ // kept in the stream, for an operator
			case err != nil, settles[0] == "nak":
				queue = append(queue, id) // a lost settle, or a nak: delivered again
			case settles[0] == "ack":
				acked[id]++
			case settles[0] == "term":
				termed[id]++
			default:
				rt.Fatalf("%s: settled %v", id, settles)
			}
		}
		if acked[""] > 0 || termed[""] > 0 || effects[""] > 0 || held[""] != noID {
			rt.Fatalf("%d messages without an id: %d acked, %d terminated, %d held, effect applied %d times",
				noID, acked[""], termed[""], held[""], effects[""])
		}
		for i := range n {
			id := fmt.Sprint("msg-", i)
			if !withID[id] {
				continue // published without one
			}
			switch {
			case held[id] > 0:
				rt.Fatalf("%s: held as if it had no id", id)
			case acked[id] > 0 && termed[id] > 0:
				rt.Fatalf("%s: both acked and terminated", id)
			case acked[id] > 0 && effects[id] != 1:
				rt.Fatalf("%s: acked with its effect applied %d times", id, effects[id])
			case termed[id] > 0 && (effects[id] != 0 || !final[id]):
				rt.Fatalf("%s: terminated (final %v) with its effect applied %d times", id, final[id], effects[id])
			case acked[id] == 0 && termed[id] == 0:
				rt.Fatalf("%s: never settled", id)
			}
		}
	})
}
