package bolt

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"

	bbolt "go.etcd.io/bbolt"
)

// An op is one write, run inside a shared write transaction. It returns its
// own result as an error (nil, backend.ErrNotOwner, ...) and must either make
// all its changes or none, so that one op's refusal never spoils the others
// in its transaction.
type op func(tx *bbolt.Tx) error

type request struct {
	op   op
	done chan error // buffered; receives the op's result once its transaction has committed, or the commit's error
	// turn is turnQueued until the committer first runs op (turnTaken), or
	// until a caller whose ctx ended takes it back (turnWithdrawn): a
	// withdrawn op is never run, so its caller may leave with nothing
	// written.
	turn atomic.Int32
}

const (
	turnQueued int32 = iota
	turnTaken
	turnWithdrawn
)

// run is the op the committer runs for r: r's own, unless its caller
// withdrew it first, in which case it writes nothing. An op the committer
// runs again, after another in its transaction rolled back, stays taken.
func (r *request) run(tx *bbolt.Tx) error {
	if r.turn.CompareAndSwap(turnQueued, turnTaken) || r.turn.Load() == turnTaken {
		return r.op(tx)
	}
	return nil
}

// rollback is the result of an op that made changes it must take back (the
// caller's fn failed inside an Update or a RunOnceTx): bbolt cannot undo
// part of a transaction, so the committer rolls the whole one back, answers
// that op with err, and runs the others again in a new transaction.
type rollback struct{ err error }

func (r rollback) Error() string { return r.err.Error() }
func (r rollback) Unwrap() error { return r.err }

// undoCorrupt returns an op's result, made a rollback if the guard
// (guard.go) found damage in it: it can find it between two of the op's
// writes, and what the op wrote before must not be committed without the
// rest.
func undoCorrupt(err error) error {
	if _, ok := err.(rollback); !ok && errors.As(err, new(damaged)) {
		return rollback{err}
	}
	return err
}

// errRolledBack ends a transaction that an op asked to roll back.
var errRolledBack = errors.New("bolt: an operation rolled its transaction back")

// committer is the one goroutine that writes. It takes the first request
// waiting, runs it in a transaction, and keeps taking every request that is
// queued by the time it has run the ones before (up to maxBatch), then
// commits them all with one fsync. A lone caller pays one commit and no
// delay; callers that arrive while a transaction is being built or
// committed share the next commit. It returns when reqs is closed and
// drained.
func committer(db *bbolt.DB, reqs <-chan *request, maxBatch int, exited chan<- struct{}) {
	defer close(exited)
	batch := make([]*request, 0, maxBatch)
	results := make([]error, 0, maxBatch)
	var later []*request // after a rollback: the requests not yet run, for the next transaction
	// broken is the error of a write in which bbolt itself panicked (a
	// damaged page read while it began, committed or rolled back its
	// transaction): it may have left its writer lock held, and another
	// write would wait for it for ever. Every request after is answered
	// with it, and none is sent to bbolt again.
	var broken error
	for first := range reqs {
		if broken != nil {
			first.done <- broken
			continue
		}
		batch = append(batch[:0], first)
		open := true // whether the transaction may gather more requests
		for len(batch) > 0 {
			results = results[:0]
			failed := -1
			err := update(db, func(tx *bbolt.Tx) error {
				for i := 0; i < len(batch) || open && (gather(reqs, &batch, maxBatch) || yieldAndGather(reqs, &batch, maxBatch)); i++ {
					results = append(results, undoCorrupt(batch[i].run(tx)))
					if _, ok := results[i].(rollback); ok {
						failed = i
						return errRolledBack
					}
				}
				return nil
			})
			if errors.Is(err, errBboltPanicked) {
				broken = err
				for _, r := range append(batch, later...) {
					r.done <- err
				}
				clear(batch)
				batch, later = batch[:0], later[:0]
				break
			}
			if failed >= 0 && errors.Is(err, errRolledBack) {
				// Answer the one that failed; commit the ones that ran
				// before it, as they are, in a transaction of their own;
				// then the rest. So each op runs at most twice for the
				// failures of others.
				batch[failed].done <- results[failed].(rollback).err
				later = append(later, batch[failed+1:]...)
				clear(batch[failed:])
				batch, open = batch[:failed], false
				if len(batch) > 0 {
					continue
				}
			} else {
				for i, r := range batch {
					if err != nil {
						r.done <- err
					} else {
						r.done <- results[i]
					}
				}
				clear(batch)
			}
			batch, later, open = append(batch[:0], later...), later[:0], true
		}
	}
}

// yieldAndGather lets the goroutines that are ready run before it gathers:
// the callers the last commit woke are about to send their next requests,
// and without a yield they miss this commit by a few microseconds and
// cost one of their own.
func yieldAndGather(reqs <-chan *request, batch *[]*request, max int) bool {
	runtime.Gosched()
	return gather(reqs, batch, max)
}

// gather appends the requests already queued to batch, up to max, without
// waiting, and reports whether it added any.
func gather(reqs <-chan *request, batch *[]*request, max int) bool {
	n := len(*batch)
	for len(*batch) < max {
		select {
		case r, ok := <-reqs:
			if !ok {
				return len(*batch) > n
			}
			*batch = append(*batch, r)
		default:
			return len(*batch) > n
		}
	}
	return len(*batch) > n
}

// update is db.Update made safe against a damaged file: bbolt reads pages
// straight from its memory map, so a corrupt page can panic, and a bad offset
// or a file truncated under it can fault. Both become an ErrCorrupt error and
// the transaction is rolled back. A panic of fn's own is fn's (its op's
// error); one of bbolt's, outside fn, also matches errBboltPanicked.
func update(db *bbolt.DB, fn func(*bbolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	inFn := false
	defer func() {
		if v := recover(); v != nil {
			if inFn {
				err = fmt.Errorf("%w: %v", ErrCorrupt, v)
			} else {
				err = fmt.Errorf("%w: %w: %v", ErrCorrupt, errBboltPanicked, v)
			}
		}
	}()
	if testHookUpdate != nil {
		testHookUpdate(db)
	}
	return db.Update(func(tx *bbolt.Tx) error {
		inFn = true
		err := fn(tx)
		inFn = false
		return err
	})
}

// errBboltPanicked is why a write failed when bbolt itself panicked in it,
// outside the write's own function: beginning, committing or rolling back
// its transaction over a damaged page.
var errBboltPanicked = errors.New("bolt: bbolt panicked outside the transaction's work, and may hold its writer lock")

// testHookUpdate, if set, runs in update before bbolt's Update: tests
// make bbolt panic there with its writer lock held.
var testHookUpdate func(*bbolt.DB)

// view is db.View with the same protection as update.
func view(db *bbolt.DB, fn func(*bbolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverCorrupt(&err)
	return db.View(fn)
}

// recoverCorrupt turns a panic into an ErrCorrupt error in *err. Deferred
// directly by every function that reads bbolt's pages.
func recoverCorrupt(err *error) {
	if v := recover(); v != nil {
		*err = fmt.Errorf("%w: %v", ErrCorrupt, v)
	}
}
