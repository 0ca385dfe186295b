package bolt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/txrun"
	bbolt "go.etcd.io/bbolt"
)

// errNested is returned by a Backend's methods called from inside an fn
// that runs in one of its write transactions: the call would wait for the
// very commit that waits for fn.
var errNested = errors.New("bolt: called from inside a transaction of the same Backend (RunOnceTx or Update), which would deadlock: use the *bbolt.Tx")

// inTx is the context key that marks the context of an fn running in a
// write transaction of the Backend it holds.
type inTx struct{}

// handoff lends the committer's transaction to the caller's goroutine, so
// that the caller's fn runs there (its panics, its stack, its
// runtime.Goexit), while the committer waits. The committer may lend the
// same request a transaction twice: when another request in its group
// rolls back, it runs the ones before that again in a new one.
type handoff struct {
	txs  chan *bbolt.Tx // committer → caller: run in this transaction
	back chan error     // caller → committer: nil to keep what was written, a rollback to undo it
}

func (h *handoff) op(tx *bbolt.Tx) error {
	h.txs <- tx
	return <-h.back
}

// lend runs fn in a write transaction of b, shared with the other writes
// waiting (group commit), on the calling goroutine. fn returns what the
// committer gets: nil keeps its writes, a rollback undoes them. If fn
// panics or exits the goroutine, its writes are undone and the panic goes
// on. lend returns once the transaction committed, or rolled fn's writes
// back: the commit's error, or the rollback's.
func (b *Backend) lend(ctx context.Context, fn func(ctx context.Context, tx *bbolt.Tx) error) error {
	if err := b.usable(ctx); err != nil {
		return err
	}
	h := &handoff{txs: make(chan *bbolt.Tx), back: make(chan error)}
	r := &request{op: h.op, done: make(chan error, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return idem.ErrClosed
	}
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		b.mu.RUnlock()
		return backend.Refuse(ctx.Err()) // the queue was full: nothing sent
	}
	b.mu.RUnlock()
	// Until the committer takes the request, a ctx that ends takes it
	// back (as write does): fn has not run, and will not.
	ended := ctx.Done()
	ctx = context.WithValue(ctx, inTx{}, b)
	for {
		select {
		case tx := <-h.txs:
			h.back <- runLent(ctx, tx, h, fn)
		case err := <-r.done:
			return err
		case <-ended:
			if r.turn.CompareAndSwap(turnQueued, turnWithdrawn) {
				return backend.Refuse(ctx.Err())
			}
			ended = nil // taken: fn runs, and its answer is waited for
		}
	}
}

// runLent runs fn in tx and returns what the committer gets. If fn does not
// return, the committer is told to roll back before the panic goes on.
func runLent(ctx context.Context, tx *bbolt.Tx, h *handoff, fn func(context.Context, *bbolt.Tx) error) (result error) {
	returned := false
	defer func() {
		if !returned {
			h.back <- rollback{errors.New("bolt: fn did not return")}
		}
	}()
	err := fn(ctx, tx)
	returned = true
	if err == nil && !idemBuckets(tx) {
		err = rollback{fmt.Errorf("bolt: fn deleted one of idem's buckets (%s, %s, %s, %s)", bucketMeta, bucketRecords, bucketExpiry, bucketPending)}
	}
	return err
}

// idemBuckets reports whether tx still has idem's buckets.
func idemBuckets(tx *bbolt.Tx) bool {
	for _, name := range [][]byte{bucketMeta, bucketRecords, bucketExpiry, bucketPending} {
		if tx.Bucket(name) == nil {
			return false
		}
	}
	return true
}

// usable returns why b cannot take a call under ctx, if it cannot.
func (b *Backend) usable(ctx context.Context) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case ctx.Value(inTx{}) == b:
		return backend.Refuse(errNested)
	case b.readOnly:
		b.mu.RLock()
		closed := b.closed
		b.mu.RUnlock()
		if closed { // closed says more than read-only, as Close's doc promises
			return idem.ErrClosed
		}
		return backend.Refuse(ErrReadOnly)
	}
	return nil
}

// Update runs fn in a read-write transaction of the file, for the caller's
// own buckets beside idem's, and commits it with the writes of the Stores
// that use b (one fsync for all). If fn returns an error or panics, its
// writes are rolled back and Update returns that error (or the panic goes
// on). bbolt cannot roll back part of a transaction: the writes that ran
// before fn in its group commit run again in a transaction of their own,
// so an fn may run twice when another in its group fails, and must not act
// outside tx.
//
// Buckets whose names start with "idem." are idem's: fn must not create,
// change or delete them (deleting one is refused, and rolled back). fn must
// not call b, nor a Store over it: as with bbolt's own Update inside
// Update, the call would wait for the commit that waits for fn. While fn
// runs, every other write to the file waits; a ctx that ends while Update
// waits for its turn ends the wait, refused (backend.ErrRefused) with fn
// not run, and once fn runs, Update waits for its commit.
func (b *Backend) Update(ctx context.Context, fn func(tx *bbolt.Tx) error) error {
	if fn == nil {
		return errors.New("bolt: Update with a nil fn")
	}
	return b.lend(ctx, func(_ context.Context, tx *bbolt.Tx) error {
		if err := fn(tx); err != nil {
			return rollback{err}
		}
		return nil
	})
}

// View runs fn in a read-only transaction of the file, for the caller's
// own buckets.
func (b *Backend) View(ctx context.Context, fn func(tx *bbolt.Tx) error) error {
	if fn == nil {
		return errors.New("bolt: View with a nil fn")
	}
	return b.read(ctx, fn)
}

// RunOnceTx is the transactional mode, for an operation whose effects are
// writes to the same bbolt file: it runs fn at most once for key, with
// the key's record, fn's own writes (through tx, in the caller's buckets
// of the same file) and the outcome committed in one bbolt transaction. A
// crash, an error from fn or a panic rolls all of it back, so there is
// never a key without its writes, nor writes without their key, and the
// key is free for the next call rather than interrupted. Only a success,
// or an error marked idem.Final, commits (a final error records the key
// and its error, but rolls fn's writes back).
//
// A duplicate waits for the first call's outcome and replays it, as with
// RunOnce; a key reused with another payload is idem.ErrPayloadMismatch.
//
// The transaction is shared with the other writes waiting on the file
// (group commit): many callers pay one fsync. bbolt cannot roll back part
// of a transaction, so when an fn fails, the whole one is rolled back, and
// the fns that ran before it in its group run again, in a transaction of
// their own, their first writes discarded: an fn runs at most twice for
// the failures of others. fn must therefore act only through tx; call
// remote services before or after, not inside. While fn runs, every other
// write to the file waits: keep it short. A result whose record would be
// larger than MaxRecordSize is refused with ErrTooLarge, and fn's writes
// are rolled back.
//
// fn runs under a context that keeps ctx's values but not its
// cancellation, bounded by the store's ExecutionTimeout. The caller waits
// under its own ctx: if ctx ends first, RunOnceTx returns an error that
// matches both idem.ErrInProgress and ctx.Err(), and the transaction goes
// on for the duplicates waiting on it.
//
// fn must not touch idem's buckets (names starting with "idem."); open
// your own buckets in tx. It must not call the Backend or a Store over it:
// such a call, made with the ctx fn is given, is refused with an error
// (one made with another ctx would wait for the commit that waits for fn,
// for ever); and a RunOnce of fn's own key waits for itself, as with
// RunOnce. store supplies the fingerprint, codec and TTL; its Backend must
// be a *Backend.
func RunOnceTx[R any](ctx context.Context, store *idem.Store[R], key string, payload any, fn func(ctx context.Context, tx *bbolt.Tx) (R, error)) (R, error) {
	var zero R
	if store == nil {
		return zero, errors.New("bolt: RunOnceTx with a nil store")
	}
	opts := txrun.Of(store).Options()
	b, ok := opts.Backend.(*Backend)
	switch {
	case !ok:
		return zero, fmt.Errorf("bolt: RunOnceTx needs a store whose Backend is a *bolt.Backend, not %T", opts.Backend)
	case fn == nil:
		return zero, errors.New("bolt: RunOnceTx with a nil fn")
	}
	if err := b.usable(ctx); err != nil {
		return zero, err // before the key is claimed in memory: a nested call must not wait on itself
	}
	return txrun.Run(ctx, store, key, payload, func(ctx context.Context, fp idem.Fingerprint) (R, error, bool) {
		return runOnceTx(ctx, store, b, key, fp, fn)
	})
}

// runOnceTx runs fn in a lent transaction that also records its outcome, if
// key has no live record; otherwise it answers from the record that stands
// (replayed, for a recorded outcome).
func runOnceTx[R any](ctx context.Context, store *idem.Store[R], b *Backend, key string, fp idem.Fingerprint, fn func(context.Context, *bbolt.Tx) (R, error)) (val R, err error, replayed bool) {
	opts := txrun.Of(store).Options()
	token := txrun.Token()
	var standing *backend.Record
	var final error // fn's final error: recorded in a transaction of its own, once fn's writes are undone
	lerr := b.lend(ctx, func(ctx context.Context, tx *bbolt.Tx) error {
		// Each time the committer lends a transaction, from the start: an
		// earlier one may have been rolled back by another op.
		standing, final = nil, nil
		now := opts.Now()
		rec, ok, err := liveRecord(b, tx, key, now)
		switch {
		case err != nil:
			return err // nothing written yet: the answer, not a rollback
		case ok:
			standing = &rec
			return nil
		}
		val, err = fn(ctx, tx)
		switch {
		case err != nil && idem.IsFinal(err):
			final = err
			return rollback{err}
		case err != nil:
			return rollback{err}
		}
		done := backend.Record{Key: key, Fingerprint: fp, Token: token, CreatedAt: now}
		if eerr := txrun.Of(store).Encode(&done, val, nil); eerr != nil {
			return rollback{eerr}
		}
		if werr := record(b, tx, done, now, opts.TTL); werr != nil {
			return rollback{werr}
		}
		return nil
	})
	if final != nil {
		return recordFinal(ctx, store, b, key, fp, token, val, final)
	}
	if lerr != nil {
		return val, lerr, false
	}
	if standing != nil {
		return txrun.Answer(store, *standing, fp)
	}
	return val, nil, false
}

// recordFinal records fn's final error, fn's writes having been rolled
// back, unless a record appeared in between.
func recordFinal[R any](ctx context.Context, store *idem.Store[R], b *Backend, key string, fp idem.Fingerprint, token string, val R, final error) (R, error, bool) {
	opts := txrun.Of(store).Options()
	var standing *backend.Record
	err := b.write(ctx, func(tx *bbolt.Tx) error {
		now := opts.Now()
		rec, ok, err := liveRecord(b, tx, key, now)
		switch {
		case err != nil:
			return err
		case ok:
			standing = &rec
			return nil
		}
		done := backend.Record{Key: key, Fingerprint: fp, Token: token, CreatedAt: now}
		if err := txrun.Of(store).Encode(&done, val, final); err != nil {
			return err
		}
		return record(b, tx, done, now, opts.TTL)
	})
	switch {
	case err != nil:
		return val, txrun.Unrecorded(final, &idem.BackendError{Op: "complete", Err: err}), false
	case standing != nil:
		return txrun.Answer(store, *standing, fp)
	}
	return val, final, false
}

// liveRecord returns key's record as seen at now, if it has a live one.
func liveRecord(b *Backend, tx *bbolt.Tx, key string, now time.Time) (backend.Record, bool, error) {
	v, err := b.bucket(tx, bucketRecords).Get([]byte(key))
	if err != nil || v == nil {
		return backend.Record{}, false, err
	}
	rec, err := decode([]byte(key), v)
	if err != nil {
		return backend.Record{}, false, err
	}
	rec, ok := rec.SeenAt(now)
	return rec, ok, nil
}

// record writes done, completed at now and expiring ttl later, over any
// expired record of its key.
func record(b *Backend, tx *bbolt.Tx, done backend.Record, now time.Time, ttl time.Duration) error {
	records := b.bucket(tx, bucketRecords)
	v, err := records.Get([]byte(done.Key))
	if err != nil {
		return err
	}
	if v != nil { // expired: drop its index entry
		old, err := decode([]byte(done.Key), v)
		if err != nil {
			return err
		}
		if err := b.bucket(tx, bucketExpiry).Delete(expiryKey(old)); err != nil {
			return err
		}
	}
	done.State, done.ExpiresAt = backend.StateCompleted, now.Add(ttl)
	if err := put(records, done); err != nil {
		return err
	}
	return b.bucket(tx, bucketExpiry).Put(expiryKey(done), nil)
}
