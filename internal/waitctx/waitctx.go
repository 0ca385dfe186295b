// Package waitctx bounds a caller's wait for its key (idemhttp's and
// idemgrpc's Options.Wait) with a context whose timer starts only when
// something waits on it.
//
// A request that claims a new key, or replays a known one, never waits:
// context.WithTimeout would make its timer, its cancelCtx and its closure
// for nothing, on every request. A Ctx makes them the first time its Done
// channel is asked for (a duplicate that waits, a child context, an
// AfterFunc), or once it is seen done; until then it is one object.
package waitctx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A Ctx is context.WithTimeout(parent, d) made lazily: the same deadline,
// values and Done, and it ends when that would. Once it has ended, Err
// and context.Cause say how, as that would, with one difference: when
// more than one end came before anything asked (its time ran out, and
// then its parent ended, or it was stopped), they may name a later one
// than the first. Stop it when the wait is over, as a CancelFunc.
type Ctx struct {
	parent   context.Context
	deadline time.Time // when d runs out; the parent's own may come first

	inner atomic.Pointer[made] // set once, under mu: read without a lock by Value and Err

	mu      sync.Mutex
	stopped bool // guarded by mu
}

// made is the context a Ctx stands for, once made.
type made struct {
	ctx    context.Context // context.WithDeadline(parent, deadline)
	cancel context.CancelFunc
}

var _ context.Context = (*Ctx)(nil)

// WithTimeout returns a Ctx under parent that ends d from now, when parent
// ends, or when it is stopped, whichever comes first.
func WithTimeout(parent context.Context, d time.Duration) *Ctx {
	return &Ctx{parent: parent, deadline: time.Now().Add(d)}
}

// Stop ends c, as context.WithTimeout's CancelFunc does, and its timer if
// it has one.
func (c *Ctx) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	if m := c.inner.Load(); m != nil {
		m.cancel()
	}
}

// ensure returns the context c stands for, making it if it is not yet made.
// A parent whose deadline comes first ends it, not a timer of its own
// that could fire first: as with context.WithDeadline, c ends when its
// parent does, and not before.
func (c *Ctx) ensure() context.Context {
	if m := c.inner.Load(); m != nil {
		return m.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.inner.Load()
	if m == nil {
		m = new(made)
		m.ctx, m.cancel = context.WithDeadline(c.parent, c.deadline)
		if c.stopped {
			m.cancel()
		}
		c.inner.Store(m)
	}
	return m.ctx
}

// Deadline returns the deadline, which is known without a timer: the
// parent's, if it comes first.
func (c *Ctx) Deadline() (time.Time, bool) {
	if pd, ok := c.parent.Deadline(); ok && pd.Before(c.deadline) {
		return pd, true
	}
	return c.deadline, true
}

// Done returns the channel closed when c ends: the context is made now.
func (c *Ctx) Done() <-chan struct{} { return c.ensure().Done() }

// Err returns nil while c has not ended, without making the context; once
// c has ended it makes it, so that Done, Err and context.Cause agree.
func (c *Ctx) Err() error {
	if m := c.inner.Load(); m != nil {
		return m.ctx.Err()
	}
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if !stopped && c.parent.Err() == nil && time.Now().Before(c.deadline) {
		return nil
	}
	return c.ensure().Err()
}

// Value returns the parent's values. Once the context is made, lookups go
// through it: the context package then finds its cancelCtx, and a child
// context or an AfterFunc under c is tied to it without a goroutine.
func (c *Ctx) Value(key any) any {
	if m := c.inner.Load(); m != nil {
		return m.ctx.Value(key)
	}
	return c.parent.Value(key)
}

func (c *Ctx) String() string { return "waitctx.WithTimeout" }
