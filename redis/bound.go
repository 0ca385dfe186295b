package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem/backend"
)

// bounded runs call, which sends commands on the backend's client under
// ctx, and returns its answer, or ctx's error once ctx ends: every Backend
// call is bounded by its ctx.
//
// go-redis ends a command's socket read or write at ctx's deadline only
// on a client with ContextTimeoutEnabled, and at a cancellation never, so
// a call whose ctx can end is waited on from a goroutine of its own
// (bound), which the caller leaves as soon as ctx ends, by its deadline or
// by a cancellation that comes first. Only a call whose ctx can never end
// runs in the caller's goroutine, with no hand-off.
//
// A call whose ctx had ended before it started is refused
// (backend.Refuse): nothing was sent.
func bounded[T any](b *Backend, ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	direct, err := b.direct(ctx)
	switch {
	case err != nil:
		var zero T
		return zero, err
	case direct:
		start := time.Now()
		v, err := call(ctx)
		return v, b.after(ctx, start, err)
	}
	return bound(ctx, b.dials, call)
}

// bounded0 is bounded for a call that returns only an error.
func bounded0(b *Backend, ctx context.Context, call func(context.Context) error) error {
	_, err := bounded(b, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) })
	return err
}

// ended returns err, or, when ctx has ended and err is no answer of the
// server's (go-redis's i/o timeout at ctx's deadline, its dial or pool
// wait cut short), ctx's error wrapping it: the call's fate is unknown,
// as a lost reply's.
func ended(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if err == nil || cerr == nil || errors.Is(err, cerr) {
		return err
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return err
	}
	return fmt.Errorf("redis: no answer before ctx ended: %w: %w", cerr, err)
}

// bound runs call, and returns its answer, or ctx's error as soon as ctx
// ends, whichever comes first, by waiting for it from a goroutine of its
// own: go-redis alone would wait for its socket timeouts, seconds after
// a cancelled ctx ended.
//
// A call whose ctx had ended before it started is refused
// (backend.Refuse): nothing was sent. A call it stops waiting for goes on
// in a goroutine until go-redis answers or gives up (its socket timeouts),
// and may still land: the Store settles that by the claim's token, as it
// does a lost reply.
//
// A call whose ctx ends while the client's dials are being refused answers
// the dial's error, not ctx's: the server is unreachable (dials, the
// client's dialWatch).
func bound[T any](ctx context.Context, dials *dialWatch, call func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, backend.Refuse(err)
	}
	start := time.Now()
	type answer struct {
		v   T
		err error
	}
	answered := make(chan answer, 1) // the goroutine never blocks on a caller that left
	go func() {
		var a answer
		returned := false
		defer func() {
			// No caller may be left to take a panic (a client's hook, say)
			// from this goroutine: it would end the process. A hook that
			// ended the goroutine (runtime.Goexit) gave no answer either.
			if p := recover(); p != nil {
				a = answer{err: fmt.Errorf("redis: panic in the client: %v", p)}
			} else if !returned {
				a = answer{err: errClientExited}
			}
			answered <- a
		}()
		a.v, a.err = call(ctx)
		returned = true
	}()
	select {
	case a := <-answered:
		return a.v, unreachable(ctx, dials, start, a.err)
	case <-ctx.Done():
		select {
		case a := <-answered: // an answer that came with the end is kept
			return a.v, unreachable(ctx, dials, start, a.err)
		default:
		}
		return zero, unreachable(ctx, dials, start, fmt.Errorf("redis: no answer before ctx ended: %w", ctx.Err()))
	}
}

// unreachable returns err, or, when err is only ctx's end (go-redis's
// own, or bound's) and the client's dials were refused meanwhile, the
// dial's error: the server is unreachable.
func unreachable(ctx context.Context, dials *dialWatch, start time.Time, err error) error {
	if cerr := ctx.Err(); err == nil || cerr == nil || !errors.Is(err, cerr) {
		return err
	}
	if derr := dials.failedSince(start); derr != nil {
		return fmt.Errorf("redis: unreachable: %w", derr)
	}
	return err
}

// errClientExited is a call's error when the client ended the goroutine
// that made it (runtime.Goexit in a hook) before it answered.
var errClientExited = errors.New("redis: the client ended its goroutine (runtime.Goexit) before answering")

// bound0 is bound for a call that returns only an error.
func bound0(ctx context.Context, dials *dialWatch, call func(context.Context) error) error {
	_, err := bound(ctx, dials, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) })
	return err
}

// direct reports whether a call under ctx runs in the caller's goroutine
// (bounded), or an error refusing it if ctx has ended.
func (b *Backend) direct(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, backend.Refuse(err)
	}
	return ctx.Done() == nil, nil
}

// after is the error of a call run in the caller's goroutine since start.
func (b *Backend) after(ctx context.Context, start time.Time, err error) error {
	return unreachable(ctx, b.dials, start, ended(ctx, err))
}
