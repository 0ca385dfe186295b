package txrun

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
)

// ErrGaveUp ends the run of a caller that stopped waiting for its key
// before the key was its to run: it was answered already, so its handler
// does not run, and the duplicates that waited on it are told to retry.
var ErrGaveUp = fmt.Errorf("%w: the caller stopped waiting for its key before it could run", idem.ErrInProgress)

// A WaitBound ends a caller's wait for its key, after a time or when the
// caller's own context ends (a client that hung up), but never its
// handler's run once that has started: a transactional adapter sends the
// answer only after the handler's transaction commits, so the caller that
// runs the handler waits for it. The transactional modes of idemhttp and
// idemgrpc claim under Ctx, call Start as their handler's first act, and
// answer from the record (a replay, a refusal) unless Started.
type WaitBound struct {
	ctx        context.Context
	cancel     context.CancelFunc
	state      atomic.Int32 // waiting, then running or gaveUp, once
	timer      *time.Timer
	stopCaller func() bool
}

const (
	waiting int32 = iota
	running
	gaveUp
)

// NewWaitBound starts the wait of a caller whose context is caller, for at
// most wait. Stop it when the caller is answered.
func NewWaitBound(caller context.Context, wait time.Duration) *WaitBound {
	b := &WaitBound{}
	b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(caller))
	b.timer = time.AfterFunc(wait, b.giveUp)
	b.stopCaller = context.AfterFunc(caller, b.giveUp)
	if caller.Err() != nil { // gone already: AfterFunc's own goroutine may come too late
		b.giveUp()
	}
	return b
}

// Ctx is what the claim waits under: it keeps the caller's values, and
// ends when the wait does.
func (b *WaitBound) Ctx() context.Context { return b.ctx }

// giveUp ends the wait, unless the handler has started.
func (b *WaitBound) giveUp() {
	if b.state.CompareAndSwap(waiting, gaveUp) {
		b.cancel()
	}
}

// Start reports whether the handler may run: the wait has not ended, and
// from now on it will not.
func (b *WaitBound) Start() bool { return b.state.CompareAndSwap(waiting, running) }

// Started reports whether the handler ran. Read once the claim has
// returned: a handler that started has finished by then.
func (b *WaitBound) Started() bool { return b.state.Load() == running }

// Stop ends the bound's timer and its watch on the caller.
func (b *WaitBound) Stop() {
	b.timer.Stop()
	b.stopCaller()
	b.cancel()
}

// A keyedBound is a WaitBound that a Run for key starts (WithBound).
type keyedBound struct {
	b   *WaitBound
	key string
}

type boundKey struct{}

// WithBound returns ctx carrying b for a Run under it for key: Run starts
// b once it owns key in this process, before its transaction begins, and
// gives up (ErrGaveUp), running nothing, if b's wait ended first. So b,
// whose Ctx ctx must be made of, bounds the wait for a call of the same
// key in flight in this process, and never the run that follows, nor
// its transaction's own waits for the database. It is how a queue
// consumer's TxConsumer bounds a redelivery's wait for the delivery in
// flight (idemqueue's BusyWait). A Run for another key, or one nested in
// the work of a Run, leaves b alone.
func WithBound(ctx context.Context, b *WaitBound, key string) context.Context {
	return context.WithValue(ctx, boundKey{}, &keyedBound{b: b, key: key})
}
