package idemqueue

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"pgregory.net/rapid"
)

// TestConsumerModel drives a Consumer with a random broker: messages
// published once or twice, some without an id (a publisher's bug),
// delivered in any order, handlers that succeed, fail (some with an error
// that wraps a store's refusal, from a call they made downstream), fail
// for good, panic, or die (the process killed before or after the effect,
// its claim left interrupted, a new process started), and every Retry
// delivered again. The handler's effect is remote (a ledger the Reconcile
// hook can look at, as a service that honours the step key). Invariants:
// no message's effect happens twice, ever; at the end every message with
// an id is acked with its effect applied once, or rejected with none
// after a final failure; every message without one is held for an
// operator, never acked nor rejected, its effect not applied.
func TestConsumerModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := idemtest.NewMemoryBackend()
		effects := map[string]int{}  // the remote service's ledger
		var dead []*idem.Ticket[int] // a killed process's claims: never released
		var stores []*idem.Store[int]
		defer func() {
			for _, tk := range dead { // after the checks: Close waits for them
				tk.Release()
			}
			for _, s := range stores {
				s.Close()
			}
		}()
		var c *Consumer[int]
		start := func() { // a new consumer process
			s := idem.New[int](idem.Options{Backend: b})
			stores = append(stores, s)
			var err error
			c, err = New(s, Options{Reconcile: func(ctx context.Context, key string, _ error) Decision {
				if effects[key] > 0 {
					if err := s.Resolve(ctx, key, effects[key], nil); err != nil {
						return Decision{Action: Retry, Err: err}
					}
				} else if err := s.Forget(ctx, key); err != nil {
					return Decision{Action: Retry, Err: err}
				}
				return Decision{Action: Retry}
			}})
			if err != nil {
				rt.Fatal(err)
			}
		}
		start()

		n := rapid.IntRange(1, 8).Draw(rt, "messages")
		ids := make([]string, n) // message i's id; "" for none
		var queue []int
		for i := range n {
			if rapid.IntRange(0, 5).Draw(rt, "no id") > 0 {
				ids[i] = fmt.Sprint("msg-", i)
			}
			queue = append(queue, i)
			if rapid.IntRange(0, 4).Draw(rt, "duplicate") == 0 {
				queue = append(queue, i) // the publisher sent it twice
			}
		}
		ran := map[int]int{} // handler runs by message, for those without an id
		final := map[string]bool{}
		acked := map[int]bool{}
		rejected := map[int]bool{}
		held := map[int]bool{} // left for an operator
		ctx := context.Background()
		for attempt := 0; len(queue) > 0; attempt++ {
			if attempt > 400 {
				rt.Fatalf("messages never settle: %v", queue)
			}
			i := rapid.IntRange(0, len(queue)-1).Draw(rt, "deliver")
			msg := queue[i]
			id := ids[msg]
			queue = append(queue[:i], queue[i+1:]...)
			what := "ok"
			if attempt < 200 { // then every handler succeeds, so that the run ends
				what = rapid.SampledFrom([]string{"ok", "ok", "fail", "refused-downstream", "final", "panic", "kill-before", "kill-after"}).Draw(rt, "handler")
			}
			if what == "kill-before" || what == "kill-after" {
				tk, err := c.Store().Begin(ctx, id, "body")
				if err == nil && !tk.Replayed() {
					if what == "kill-after" {
						effects[id]++
					}
					dead = append(dead, tk) // the process dies here
					b.Crash()
					start()
				}
				queue = append(queue, msg) // unacked: the broker redelivers it
				continue
			}
			d := c.Handle(ctx, id, "body", func(context.Context) (int, error) {
				ran[msg]++
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
			if id != "" && effects[id] > 1 {
				rt.Fatalf("%s: effect applied %d times", id, effects[id])
			}
			switch d.Action {
			case Ack:
				acked[msg] = true
			case Reject:
				rejected[msg] = true
			case Retry:
				queue = append(queue, msg)
			case Hold: // dead-lettered, or parked in a retry queue: an operator's now
				held[msg] = true
			default:
				rt.Fatalf("message %d (%q): decision %+v", msg, id, d)
			}
		}
		for msg, id := range ids {
			switch {
			case id == "" && (acked[msg] || rejected[msg] || !held[msg] || ran[msg] > 0):
				rt.Fatalf("message %d without an id: acked %v, rejected %v, held %v, handler ran %d times",
					msg, acked[msg], rejected[msg], held[msg], ran[msg])
			case id == "":
			case held[msg]:
				rt.Fatalf("%s: held", id)
			case acked[msg] && rejected[msg]:
				rt.Fatalf("%s: both acked and rejected", id)
			case acked[msg] && effects[id] != 1:
				rt.Fatalf("%s: acked with its effect applied %d times", id, effects[id])
			case rejected[msg] && (effects[id] != 0 || !final[id]):
				rt.Fatalf("%s: rejected (final %v) with its effect applied %d times", id, final[id], effects[id])
			case !acked[msg] && !rejected[msg]:
				rt.Fatalf("%s: never settled", id)
			}
		}
	})
}
