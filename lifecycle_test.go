package idem_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	lc "github.com/seed094d4201/idem/internal/lifecycle"
)

// TestEveryLifecycleMoveIsMadeThroughTheStore derives every (phase, event)
// pair from the lifecycle's table and drives each through a Store, on
// memory alone, on MemoryBackend and on bolt wherever the phase exists
// there, hearing the table's own move made: a row no driver reaches, or a
// driver for a row the table lacks, fails.
func TestEveryLifecycleMoveIsMadeThroughTheStore(t *testing.T) {
	for _, tr := range lc.Transitions() {
		pair := lcPair{tr.From, tr.Event}
		d, ok := lcDrivers[pair]
		if !ok {
			t.Errorf("no driver for the lifecycle's %v on %v", tr.Event, tr.From)
			continue
		}
		ran := 0
		for _, cfg := range lcConfigs {
			if cfg.durable && d.on&onBackend == 0 || !cfg.durable && d.on&onMemory == 0 {
				continue
			}
			ran++
			t.Run(fmt.Sprintf("%v/%v/%s", tr.From, tr.Event, cfg.name), func(t *testing.T) {
				h := newLCHarness(t, cfg)
				d.drive(t, h)
				if got := h.heard(t, tr.From, tr.Event); got != tr.Move {
					t.Fatalf("%v on %v moved to %v (%v); the table says %v (%v)", tr.Event, tr.From, got.To, got.Answer, tr.To, tr.Answer)
				}
			})
		}
		if ran == 0 {
			t.Errorf("the driver of %v on %v runs on no store", tr.Event, tr.From)
		}
	}
	rows := map[lcPair]bool{}
	for _, tr := range lc.Transitions() {
		rows[lcPair{tr.From, tr.Event}] = true
	}
	for pair := range lcDrivers {
		if !rows[pair] {
			t.Errorf("a driver for %v on %v, which the lifecycle's table lacks", pair.ev, pair.from)
		}
	}
	if n, last := lc.Strays(); n > 0 {
		t.Errorf("the Store asked the lifecycle for %d moves it lacks (the last: %s)", n, last)
	}
}

type lcPair struct {
	from lc.Phase
	ev   lc.Event
}

// An lcDriver brings h's key to a phase through h's store, then makes an
// event happen to it. durable says whether it needs a Backend.
type lcDriver struct {
	on    lcWhere
	drive func(t *testing.T, h *lcHarness)
}

// lcWhere says on which stores a driver runs: those with no Backend,
// those with one, or both. A phase that exists on one kind only (a
// completed outcome is kept in memory only without a Backend; a claim
// and a pin need one) is driven there.
type lcWhere int

const (
	onMemory lcWhere = 1 << iota
	onBackend
	onBoth = onMemory | onBackend
)

type lcConfig struct {
	name    string
	durable bool
	open    func(t *testing.T) backend.Backend
}

var lcConfigs = []lcConfig{
	{"memory", false, func(*testing.T) backend.Backend { return nil }},
	{"MemoryBackend", true, func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }},
	{"bolt", true, func(t *testing.T) backend.Backend {
		b, err := bolt.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}},
}

var lcDrivers = map[lcPair]lcDriver{
	{lc.Absent, lc.Claim}:        {onMemory, func(t *testing.T, h *lcHarness) { h.begin(t, "p") }},
	{lc.Absent, lc.ClaimDurable}: {onBackend, func(t *testing.T, h *lcHarness) { h.begin(t, "p") }},
	{lc.Absent, lc.Unpin}: {onBackend, func(t *testing.T, h *lcHarness) {
		// A Backend that ends the goroutine in Complete: the entry is
		// released, and the outcome recorded in the background, whose
		// unpin then finds the entry gone.
		h.gate.exitComplete()
		h.begin(t, "p")
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			h.finish(t, nil)
		}()
		<-exited
	}},
	{lc.Absent, lc.Reconcile}: {onBackend, func(t *testing.T, h *lcHarness) {
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
	{lc.Claiming, lc.Call}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.claiming(t)
		h.callUntilHeard(t, "p", lc.Claiming, lc.Call)
		h.gate.releaseClaim()
	}},
	{lc.Claiming, lc.CallOther}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.claiming(t)
		h.callUntilHeard(t, "q", lc.Claiming, lc.CallOther)
		h.gate.releaseClaim()
	}},
	{lc.Claiming, lc.Confirm}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.claiming(t)
		h.gate.releaseClaim()
		h.finishHeld(t)
	}},
	{lc.Claiming, lc.Release}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.gate.refuseClaim()
		if _, err := h.s.Begin(context.Background(), h.key, "p"); !errors.As(err, new(*idem.BackendError)) {
			t.Fatalf("a refused claim: %v", err)
		}
	}},
	{lc.Claiming, lc.Reconcile}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.claiming(t)
		if err := h.s.Forget(context.Background(), h.key); !errors.Is(err, idem.ErrKeyHeld) {
			t.Errorf("Forget of a key claiming here: %v", err)
		}
		h.gate.releaseClaim()
	}},
	{lc.Running, lc.Call}: {onBoth, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		h.callUntilHeard(t, "p", lc.Running, lc.Call)
	}},
	{lc.Running, lc.CallOther}: {onBoth, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		if _, err := h.s.Begin(context.Background(), h.key, "q"); !errors.Is(err, idem.ErrPayloadMismatch) {
			t.Fatalf("another payload while running: %v", err)
		}
	}},
	{lc.Running, lc.Forget}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		if err := h.s.Forget(context.Background(), h.key); !errors.Is(err, idem.ErrKeyHeld) {
			t.Errorf("Forget of a key running here: %v", err)
		}
	}},
	{lc.Running, lc.Reconcile}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		if err := h.s.Forget(context.Background(), h.key); !errors.Is(err, idem.ErrKeyHeld) {
			t.Errorf("Forget of a key running here: %v", err)
		}
	}},
	{lc.Running, lc.Complete}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		h.finish(t, nil)
	}},
	{lc.Running, lc.Pin}: {onBackend, func(t *testing.T, h *lcHarness) { h.pinned(t) }},
	{lc.Running, lc.Release}: {onBoth, func(t *testing.T, h *lcHarness) {
		h.begin(t, "p")
		h.finish(t, errors.New("failed before commit"))
	}},
	{lc.Running, lc.Unpin}: {onBackend, func(t *testing.T, h *lcHarness) {
		// The outcome lands in the background while its execution is
		// still telling the Observer it was not recorded, before the pin.
		h.observer.NotRecorded = func(context.Context, string, error) {
			h.gate.allowComplete()
			h.heard(t, lc.Running, lc.Unpin)
		}
		h.gate.refuseCompletes()
		h.begin(t, "p")
		h.finish(t, nil)
	}},
	{lc.Pinned, lc.Call}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.pinned(t)
		if tk, err := h.s.Begin(context.Background(), h.key, "p"); err != nil || !tk.Replayed() {
			t.Fatalf("a call on a pinned outcome: %v", err)
		}
	}},
	{lc.Pinned, lc.CallOther}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.pinned(t)
		if _, err := h.s.Begin(context.Background(), h.key, "q"); !errors.Is(err, idem.ErrPayloadMismatch) {
			t.Fatalf("another payload on a pinned outcome: %v", err)
		}
	}},
	{lc.Pinned, lc.Unpin}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.pinned(t)
		h.gate.allowComplete()
	}},
	{lc.Pinned, lc.Reconcile}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.pinned(t)
		if err := h.s.Forget(context.Background(), h.key); !errors.Is(err, idem.ErrKeyHeld) {
			t.Errorf("Forget of an outcome this store is still recording: %v", err)
		}
		if err := h.s.Resolve(context.Background(), h.key, "r", nil); !errors.Is(err, idem.ErrKeyHeld) {
			t.Errorf("Resolve of an outcome this store is still recording: %v", err)
		}
	}},
	{lc.Completed, lc.Call}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.completed(t)
		if tk, err := h.s.Begin(context.Background(), h.key, "p"); err != nil || !tk.Replayed() {
			t.Fatalf("a call on a completed outcome: %v", err)
		}
	}},
	{lc.Completed, lc.CallOther}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.completed(t)
		if _, err := h.s.Begin(context.Background(), h.key, "q"); !errors.Is(err, idem.ErrPayloadMismatch) {
			t.Fatalf("another payload on a completed outcome: %v", err)
		}
	}},
	{lc.Completed, lc.Forget}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.completed(t)
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
	{lc.Completed, lc.Expire}: {onMemory, func(t *testing.T, h *lcHarness) {
		h.completed(t)
		h.clock.Add(time.Hour + time.Second)
		if n, err := h.s.Sweep(context.Background()); err != nil || n != 1 {
			t.Fatalf("Sweep past the TTL: %d, %v", n, err)
		}
	}},
	{lc.Reconciling, lc.Call}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.gate.forgetting = func() { h.callUntilHeard(t, "zero", lc.Reconciling, lc.Call) }
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
	{lc.Reconciling, lc.CallOther}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.gate.forgetting = func() { h.callUntilHeard(t, "p", lc.Reconciling, lc.CallOther) }
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
	{lc.Reconciling, lc.Reconcile}: {onBackend, func(t *testing.T, h *lcHarness) {
		h.gate.forgetting = func() {
			h.gate.forgetting = nil
			if err := h.s.Forget(context.Background(), h.key); !errors.Is(err, idem.ErrKeyHeld) {
				t.Errorf("a Forget during another: %v", err)
			}
		}
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
	{lc.Reconciling, lc.Reconciled}: {onBackend, func(t *testing.T, h *lcHarness) {
		if err := h.s.Forget(context.Background(), h.key); err != nil {
			t.Fatal(err)
		}
	}},
}

// An lcHarness is one store and one key, with the moves of the key's
// entry heard as they are made.
type lcHarness struct {
	s        *idem.Store[string]
	key      string
	gate     *lcGate // nil without a Backend
	clock    *lcClock
	observer *idem.Observer

	mu      sync.Mutex
	moves   []lcMoved // guarded by mu
	moved   chan struct{}
	tickets []*idem.Ticket[string] // guarded by mu: begun, not yet finished
	calls   sync.WaitGroup         // calls still running on their own goroutines
}

type lcMoved struct {
	from lc.Phase
	ev   lc.Event
	m    lc.Move
}

type lcClock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the real clock stepped forward by Add: the store alone judges
// time here, by it.
func (c *lcClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *lcClock) Add(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

func newLCHarness(t *testing.T, cfg lcConfig) *lcHarness {
	h := &lcHarness{
		key:      "lifecycle-" + t.Name(),
		clock:    new(lcClock),
		observer: new(idem.Observer),
		moved:    make(chan struct{}, 1),
	}
	opts := idem.Options{TTL: time.Hour, Now: h.clock.Now, Observer: h.observer, SweepInterval: -1,
		Fingerprint: lcFingerprint}
	if b := cfg.open(t); b != nil {
		h.gate = &lcGate{Backend: b}
		opts.Backend = h.gate
	}
	t.Cleanup(idem.HearMoves(func(key string, from lc.Phase, ev lc.Event, m lc.Move) {
		if key != h.key {
			return
		}
		h.mu.Lock()
		h.moves = append(h.moves, lcMoved{from, ev, m})
		h.mu.Unlock()
		select {
		case h.moved <- struct{}{}:
		default:
		}
	}))
	h.s = idem.New[string](opts)
	t.Cleanup(func() {
		if h.gate != nil {
			h.gate.open()
		}
		h.calls.Wait()
		h.mu.Lock()
		tickets := h.tickets
		h.mu.Unlock()
		for _, tk := range tickets {
			tk.Release()
		}
		if err := h.s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// lcFingerprint is DefaultFingerprint, but for the payload "zero", whose
// fingerprint is the zero one: what a reconciliation's mark holds.
func lcFingerprint(payload any) (idem.Fingerprint, error) {
	if payload == "zero" {
		return idem.Fingerprint{}, nil
	}
	return idem.DefaultFingerprint(payload)
}

// heard waits for the move ev makes from from on h's key and returns it.
func (h *lcHarness) heard(t *testing.T, from lc.Phase, ev lc.Event) lc.Move {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		for _, mv := range h.moves {
			if mv.from == from && mv.ev == ev {
				h.mu.Unlock()
				return mv.m
			}
		}
		h.mu.Unlock()
		select {
		case <-h.moved:
		case <-timeout.C:
			t.Errorf("%v on %v: never heard in 10s; heard %v", ev, from, h.moves)
			return lc.Move{}
		}
	}
}

// begin claims h's key for payload and keeps the ticket.
func (h *lcHarness) begin(t *testing.T, payload string) {
	tk, err := h.s.Begin(context.Background(), h.key, payload)
	if err != nil || tk.Replayed() {
		t.Errorf("Begin(%s): %v", payload, err)
		return
	}
	h.mu.Lock()
	h.tickets = append(h.tickets, tk)
	h.mu.Unlock()
}

// finish finishes the ticket last begun with err.
func (h *lcHarness) finish(t *testing.T, err error) {
	h.mu.Lock()
	tk := h.tickets[len(h.tickets)-1]
	h.tickets = h.tickets[:len(h.tickets)-1]
	h.mu.Unlock()
	if _, ferr := tk.Finish("v", err); !errors.Is(ferr, err) {
		t.Errorf("Finish(%v): %v", err, ferr)
	}
}

// claiming begins a call whose claim the Backend holds until
// releaseClaim: the key's entry is Claiming meanwhile.
func (h *lcHarness) claiming(t *testing.T) {
	claimed := h.gate.holdClaim()
	h.calls.Add(1)
	go func() {
		defer h.calls.Done()
		h.begin(t, "p")
	}()
	<-claimed
}

// finishHeld finishes the call claiming began, once its claim is let go.
func (h *lcHarness) finishHeld(t *testing.T) {
	h.calls.Wait()
	h.finish(t, nil)
}

// callUntilHeard calls h's key with payload on its own goroutine until
// the move ev makes from from is heard, then lets the call go.
func (h *lcHarness) callUntilHeard(t *testing.T, payload string, from lc.Phase, ev lc.Event) {
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan struct{})
	go func() {
		defer close(left)
		if _, err := h.s.Begin(ctx, h.key, payload); !errors.Is(err, idem.ErrInProgress) {
			t.Errorf("a call left waiting: %v", err)
		}
	}()
	h.heard(t, from, ev)
	cancel()
	<-left
}

// pinned runs h's key to a final outcome the Backend refuses to record
// until allowComplete: the entry is Pinned.
func (h *lcHarness) pinned(t *testing.T) {
	h.gate.refuseCompletes()
	h.begin(t, "p")
	var nre *idem.NotRecordedError
	h.observer.NotRecorded = func(_ context.Context, _ string, err error) { errors.As(err, &nre) }
	h.finish(t, nil)
	if nre == nil {
		t.Errorf("a refused Complete was not reported unrecorded")
	}
	h.heard(t, lc.Running, lc.Pin)
}

// completed runs h's key to a final outcome, kept in memory.
func (h *lcHarness) completed(t *testing.T) {
	h.begin(t, "p")
	h.finish(t, nil)
}

// An lcGate is a Backend whose Claim a test holds, refuses or lets
// through, whose Complete it refuses or makes end its goroutine, and whose
// Forget runs forgetting once it has forgotten.
type lcGate struct {
	backend.Backend
	forgetting func() // set before the Forget that runs it

	mu           sync.Mutex
	claimHold    chan struct{} // the next Claim waits for it to close
	claimed      chan struct{} // closed as that Claim arrives
	claimRefused bool
	completeNo   bool // Complete is refused
	completeExit bool // the next Complete ends its goroutine (runtime.Goexit)
}

func (g *lcGate) holdClaim() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.claimHold, g.claimed = make(chan struct{}), make(chan struct{})
	return g.claimed
}

func (g *lcGate) releaseClaim() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claimHold != nil {
		close(g.claimHold)
		g.claimHold = nil
	}
}

func (g *lcGate) refuseClaim() {
	g.mu.Lock()
	g.claimRefused = true
	g.mu.Unlock()
}

func (g *lcGate) refuseCompletes() {
	g.mu.Lock()
	g.completeNo = true
	g.mu.Unlock()
}

func (g *lcGate) exitComplete() {
	g.mu.Lock()
	g.completeExit = true
	g.mu.Unlock()
}

func (g *lcGate) allowComplete() {
	g.mu.Lock()
	g.completeNo = false
	g.mu.Unlock()
}

// open lets everything through, for the test's cleanup.
func (g *lcGate) open() {
	g.releaseClaim()
	g.allowComplete()
}

func (g *lcGate) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	g.mu.Lock()
	hold, claimed, refused := g.claimHold, g.claimed, g.claimRefused
	g.claimed = nil
	g.mu.Unlock()
	if refused {
		return backend.Record{}, false, backend.ErrRefused
	}
	if claimed != nil {
		close(claimed)
		select {
		case <-hold:
		case <-ctx.Done():
			return backend.Record{}, false, backend.Refuse(ctx.Err())
		}
	}
	return g.Backend.Claim(ctx, rec, now, lease)
}

func (g *lcGate) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	g.mu.Lock()
	refused, exit := g.completeNo, g.completeExit
	g.completeExit = false
	g.mu.Unlock()
	if exit {
		runtime.Goexit()
	}
	if refused {
		return backend.ErrRefused
	}
	return g.Backend.Complete(ctx, rec, now, ttl)
}

func (g *lcGate) Forget(ctx context.Context, key string, now time.Time) error {
	err := g.Backend.Forget(ctx, key, now)
	if err == nil && g.forgetting != nil {
		g.forgetting()
	}
	return err
}
