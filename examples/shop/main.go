// Command shop tells the story of a payment whose reply is lost: a shop pays
// for order 101, the network drops the payment service's first reply, and
// the shop retries. Without an idempotency key the retry charges the
// customer again; with one, made once with the order and sent on every try,
// the retry gets the first answer back.
//
//	go run ./examples/shop
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/seed094d4201/idem"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shop:", err)
		os.Exit(1)
	}
}

// ChargeRequest asks the payment service to take Amount rupees for Order.
type ChargeRequest struct {
	Order  int `json:"order"`
	Amount int `json:"amount"`
}

// Charge is one row of the payment service's ledger, and its reply.
type Charge struct {
	ID     int
	Order  int
	Amount int
}

func (c Charge) String() string {
	return fmt.Sprintf("charge %d, order %d, %d rupees", c.ID, c.Order, c.Amount)
}

// Payments is the payment service. Charge takes the money on every call;
// ChargeOnce takes it once per idempotency key.
type Payments struct {
	keys *idem.Store[Charge]

	mu     sync.Mutex
	ledger []Charge // guarded by mu
}

func NewPayments() *Payments {
	return &Payments{keys: idem.New[Charge](idem.Options{})}
}

func (p *Payments) Close() error { return p.keys.Close() }

// Charge takes the money. Call it twice and it takes the money twice.
func (p *Payments) Charge(req ChargeRequest) Charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := Charge{ID: len(p.ledger) + 1, Order: req.Order, Amount: req.Amount}
	p.ledger = append(p.ledger, c)
	return c
}

// ChargeOnce takes the money once per key; a retry with the same key gets the
// first answer back, and the same key with another request is refused.
func (p *Payments) ChargeOnce(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	return p.keys.RunOnce(ctx, key, req, func(context.Context) (Charge, error) {
		return p.Charge(req), nil
	})
}

// Charged returns how many times order was charged, and the total.
func (p *Payments) Charged(order int) (times, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.ledger {
		if c.Order == order {
			times++
			total += c.Amount
		}
	}
	return times, total
}

var errNoReply = errors.New("no reply")

// FlakyNetwork carries each request to the payment service but loses the
// first replies on their way back: the work is done, the answer never
// arrives.
type FlakyNetwork struct {
	mu          sync.Mutex
	repliesLost int // guarded by mu; replies still to lose
}

func (n *FlakyNetwork) Call(service func() (Charge, error)) (Charge, error) {
	reply, err := service() // the payment service does the work...
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.repliesLost > 0 {
		n.repliesLost--
		return Charge{}, errNoReply // ...but the answer never reaches the shop
	}
	return reply, err
}

// pay tries up to three times. Every try sends the same request, and the
// same key if there is one.
func pay(w io.Writer, net *FlakyNetwork, service func() (Charge, error)) (Charge, error) {
	for attempt := 1; attempt <= 3; attempt++ {
		reply, err := net.Call(service)
		if !errors.Is(err, errNoReply) {
			return reply, err
		}
		fmt.Fprintf(w, "  try %d: no reply. Did it go through? Trying again.\n", attempt)
	}
	return Charge{}, errors.New("the payment service is not answering")
}

// newKey makes a random version 4 UUID, the key for one payment.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func run(w io.Writer) error {
	ctx := context.Background()
	order101 := ChargeRequest{Order: 101, Amount: 450}
	report := func(p *Payments, order int) {
		times, total := p.Charged(order)
		fmt.Fprintf(w, "  order %d was charged %d time(s), %d rupees in all\n", order, times, total)
	}

	fmt.Fprintln(w, "Order 101, without an idempotency key:")
	p := NewPayments()
	defer p.Close()
	reply, err := pay(w, &FlakyNetwork{repliesLost: 1}, func() (Charge, error) { return p.Charge(order101), nil })
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  reply:", reply)
	report(p, 101)

	fmt.Fprintln(w, "\nOrder 101, with a key made once with the order:")
	p = NewPayments()
	defer p.Close()
	key := newKey() // a real shop saves it with order 101
	reply, err = pay(w, &FlakyNetwork{repliesLost: 1}, func() (Charge, error) { return p.ChargeOnce(ctx, key, order101) })
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  reply:", reply)
	report(p, 101)

	fmt.Fprintln(w, "\nFive taps on Pay at once, one key:")
	p = NewPayments()
	defer p.Close()
	key = newKey()
	replies := make([]Charge, 5)
	errs := make([]error, 5)
	tap := make(chan struct{})
	var taps sync.WaitGroup
	for i := range replies {
		taps.Add(1)
		go func() {
			defer taps.Done()
			<-tap // all five arrive together
			replies[i], errs[i] = p.ChargeOnce(ctx, key, order101)
		}()
	}
	close(tap)
	taps.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	same := 0
	for _, r := range replies {
		if r == replies[0] {
			same++
		}
	}
	fmt.Fprintf(w, "  %d replies, %d of them %v\n", len(replies), same, replies[0])
	report(p, 101)

	fmt.Fprintln(w, "\nThe same key sent again with order 102:")
	_, err = p.ChargeOnce(ctx, key, ChargeRequest{Order: 102, Amount: 990})
	if !errors.Is(err, idem.ErrPayloadMismatch) {
		return fmt.Errorf("reused key: got %v, want a refusal", err)
	}
	fmt.Fprintln(w, "  refused:", err)
	report(p, 102)
	return nil
}
