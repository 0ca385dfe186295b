// Command shop tells the story of a payment whose reply is lost: a shop pays
// for order 101, the network drops the payment service's first reply, and
// the shop retries. Without an idempotency key the retry charges the
// customer again; with one, made once with the order and sent on every try,
// the retry gets the first answer back, even when the payment service
// restarts in between, since it keeps its keys in a bbolt file.
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
	"path/filepath"
	"sync"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
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

// Ledger is where the money moves: one row per charge. It outlives the
// payment service's process, as a bank's books do.
type Ledger struct {
	mu   sync.Mutex
	rows []Charge // guarded by mu
}

// Charge takes the money. Call it twice and it takes the money twice.
func (l *Ledger) Charge(req ChargeRequest) Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := Charge{ID: len(l.rows) + 1, Order: req.Order, Amount: req.Amount}
	l.rows = append(l.rows, c)
	return c
}

// Charged returns how many times order was charged, and the total.
func (l *Ledger) Charged(order int) (times, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.rows {
		if c.Order == order {
			times++
			total += c.Amount
		}
	}
	return times, total
}

// Payments is the payment service: ChargeOnce takes the money once per
// idempotency key. Its keys live in memory, or in backend if there is one.
type Payments struct {
	ledger *Ledger
	keys   *idem.Store[Charge]
}

func NewPayments(ledger *Ledger, backend backend.Backend) *Payments {
	return &Payments{ledger: ledger, keys: idem.New[Charge](idem.Options{Backend: backend})}
}

func (p *Payments) Close() error { return p.keys.Close() }

// ChargeOnce takes the money once per key; a retry with the same key gets the
// first answer back, and the same key with another request is refused.
func (p *Payments) ChargeOnce(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	return p.keys.RunOnce(ctx, key, req, func(context.Context) (Charge, error) {
		return p.ledger.Charge(req), nil
	})
}

var errNoReply = errors.New("no reply")

// FlakyNetwork carries each request to the payment service but loses the
// first replies on their way back: the work is done, the answer never
// arrives.
type FlakyNetwork struct {
	mu          sync.Mutex
	repliesLost int    // guarded by mu; replies still to lose
	afterLoss   func() // if set, runs after each lost reply
}

func (n *FlakyNetwork) Call(service func() (Charge, error)) (Charge, error) {
	reply, err := service() // the payment service does the work...
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.repliesLost > 0 {
		n.repliesLost--
		if n.afterLoss != nil {
			n.afterLoss()
		}
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
	var ledger *Ledger
	report := func(order int) {
		times, total := ledger.Charged(order)
		fmt.Fprintf(w, "  order %d was charged %d time(s), %d rupees in all\n", order, times, total)
	}

	fmt.Fprintln(w, "Order 101, without an idempotency key:")
	ledger = &Ledger{}
	reply, err := pay(w, &FlakyNetwork{repliesLost: 1}, func() (Charge, error) { return ledger.Charge(order101), nil })
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  reply:", reply)
	report(101)

	fmt.Fprintln(w, "\nOrder 101, with a key made once with the order:")
	ledger = &Ledger{}
	p := NewPayments(ledger, nil)
	defer p.Close()
	key := newKey() // a real shop saves it with order 101
	reply, err = pay(w, &FlakyNetwork{repliesLost: 1}, func() (Charge, error) { return p.ChargeOnce(ctx, key, order101) })
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  reply:", reply)
	report(101)

	fmt.Fprintln(w, "\nFive taps on Pay at once, one key:")
	ledger = &Ledger{}
	p = NewPayments(ledger, nil)
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
	report(101)

	fmt.Fprintln(w, "\nThe same key sent again with order 102:")
	_, err = p.ChargeOnce(ctx, key, ChargeRequest{Order: 102, Amount: 990})
	if !errors.Is(err, idem.ErrPayloadMismatch) {
		return fmt.Errorf("reused key: got %v, want a refusal", err)
	}
	fmt.Fprintln(w, "  refused:", err)
	report(102)

	ledger = &Ledger{}
	if err := restart(ctx, w, ledger, order101); err != nil {
		return err
	}
	report(101)
	return nil
}

// service is the payment service's process: its keys in a bbolt file.
type service struct {
	*Payments
	backend *bolt.Backend
}

func startService(ledger *Ledger, path string) (*service, error) {
	b, err := bolt.Open(path, nil)
	if err != nil {
		return nil, err
	}
	return &service{Payments: NewPayments(ledger, b), backend: b}, nil
}

func (s *service) stop() error { return errors.Join(s.Payments.Close(), s.backend.Close()) }

// restart tells the last part of the story: the payment service keeps its
// keys in a bbolt file and restarts after charging order 101 but before the
// shop's retry arrives.
func restart(ctx context.Context, w io.Writer, ledger *Ledger, order101 ChargeRequest) error {
	fmt.Fprintln(w, "\nOrder 101, and the service restarts before the retry (keys in a bbolt file):")
	dir, err := os.MkdirTemp("", "shop")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "payments.db")

	svc, err := startService(ledger, path)
	if err != nil {
		return err
	}
	defer func() { _ = svc.stop() }()
	var restartErr error
	net := &FlakyNetwork{repliesLost: 1, afterLoss: func() {
		fmt.Fprintln(w, "  the payment service restarts: its store and file are closed and reopened")
		if restartErr = svc.stop(); restartErr == nil {
			svc, restartErr = startService(ledger, path)
		}
	}}
	key := newKey()
	reply, err := pay(w, net, func() (Charge, error) {
		if restartErr != nil {
			return Charge{}, restartErr
		}
		return svc.ChargeOnce(ctx, key, order101)
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  reply:", reply)
	return nil
}
