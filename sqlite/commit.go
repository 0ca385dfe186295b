package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

// maxBatch bounds how many writes share one transaction: a commit that
// waits for more would hold the first caller longer than its fsync.
const maxBatch = 128

// A writeOp is one write, run by the committer inside a transaction that
// it shares with the writes queued with it. It returns an error only for a
// failure, after which the committer rolls the whole transaction back: an
// op's own answer (rows changed, ErrNotOwner) goes to its caller some other
// way. It may run more than once, in transactions that were rolled back,
// and must set its answer afresh each time.
type writeOp func(ctx context.Context, tx *sql.Tx) error

// A writeReq is a writeOp waiting for its commit.
type writeReq struct {
	ctx  context.Context
	op   writeOp
	turn atomic.Int32 // queued, taken (by the committer), or withdrawn (by the caller)
	done chan error   // buffered; the op's error or the commit's, once its transaction has ended
}

const (
	queued int32 = iota
	taken
	withdrawn
)

// do runs op in the next shared transaction and returns once that has
// committed (nil) or failed (its error). A caller whose ctx ends while op
// is still queued withdraws it: nothing of it was sent, so that is a
// refusal. Once taken, op is not interrupted (SQLite rolls back the whole
// transaction a statement is interrupted in, every other caller's writes
// with it), and do waits for it: a few statements, and one commit.
func (b *Backend) do(ctx context.Context, op writeOp) error {
	if ctx.Value(inTx{}) == b {
		return backend.Refuse(errNested)
	}
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err)
	}
	r := &writeReq{ctx: ctx, op: op, done: make(chan error, 1)}
	b.qmu.Lock()
	b.queue = append(b.queue, r)
	if !b.committing {
		b.committing = true
		go b.commit()
	}
	b.qmu.Unlock()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		if r.turn.CompareAndSwap(queued, withdrawn) {
			b.drop(r)
			return backend.Refuse(ctx.Err())
		}
		return <-r.done // taken: answered once its transaction ends, or refused if requeued
	}
}

// drop takes a withdrawn request out of the queue, so that callers who
// leave while the write turn is held long (a RunOnceTx, another process's
// lock) leave nothing behind.
func (b *Backend) drop(r *writeReq) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if i := slices.Index(b.queue, r); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
}

// next takes the first request of the queue that its caller has not
// withdrawn, or returns nil when none is left.
func (b *Backend) next() *writeReq {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for len(b.queue) > 0 {
		r := b.pop()
		if r.turn.CompareAndSwap(queued, taken) {
			return r
		}
	}
	return nil
}

// pop takes the head off the queue. b.qmu must be held.
func (b *Backend) pop() *writeReq {
	r := b.queue[0]
	b.queue[0] = nil
	b.queue = b.queue[1:]
	if len(b.queue) == 0 {
		b.queue = nil // let the array go: a burst can leave a long one behind
	}
	return r
}

// more reports whether requests wait, and ends the committer if none do:
// in the same critical section as do's check, so that a request is never
// queued with no committer to take it.
func (b *Backend) more() bool {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for len(b.queue) > 0 && b.queue[0].turn.Load() == withdrawn {
		b.pop()
	}
	if len(b.queue) == 0 {
		b.committing = false
		return false
	}
	return true
}

// requeue puts rs back at the head of the queue, for the next
// transaction, where their callers may withdraw them again; a request
// whose caller has left already (do waits for its answer) is refused now,
// since nothing of it was committed.
func (b *Backend) requeue(rs []*writeReq) {
	back := make([]*writeReq, 0, len(rs))
	for _, r := range rs {
		if err := r.ctx.Err(); err != nil {
			r.done <- backend.Refuse(err)
			continue
		}
		r.turn.Store(queued)
		back = append(back, r)
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.queue = append(back, b.queue...)
}

// live reports whether a request in the queue still waits.
func (b *Backend) live() bool {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for _, r := range b.queue {
		if r.turn.Load() == queued {
			return true
		}
	}
	return false
}

// commit is the committer: while requests are queued, it takes the
// process's write turn (which RunOnceTx takes too), begins a transaction,
// runs every request queued by then (up to maxBatch) and commits them all
// with one fsync. A lone caller pays one commit and no delay; callers that
// arrive while a transaction is being built or committed share the next.
// It exits when the queue is empty; do starts another.
func (b *Backend) commit() {
	for {
		b.write <- struct{}{}
		more := b.batch()
		<-b.write
		if !more {
			return
		}
	}
}

// batch runs one transaction of queued requests and answers them. It
// reports false once the queue is empty and the committer has ended.
func (b *Backend) batch() bool {
	tx, err := b.begin()
	if err != nil {
		// Every request would meet the same: a closed database, most
		// likely. Answer those queued now; later ones try again.
		for r := b.next(); r != nil; r = b.next() {
			r.done <- closedErr(err)
		}
		return b.more()
	}
	if tx == nil {
		return b.more() // every caller withdrew while the lock was busy
	}
	limit := maxBatch
	if b.solo > 0 { // after a failed commit: one write a transaction, to find the one that failed
		b.solo--
		limit = 1
	}
	var run []*writeReq
	for len(run) < limit {
		r := b.next()
		if r == nil {
			// The callers the last commit answered are about to send
			// their next writes: without a yield they miss this
			// transaction by microseconds, and pay one of their own.
			runtime.Gosched()
			if r = b.next(); r == nil {
				break
			}
		}
		// Not r.ctx itself: see do.
		if err := r.op(context.WithoutCancel(r.ctx), tx); err != nil {
			// The op may have written part of what it meant to: roll all
			// back, and run the others again without it. A database
			// opened without _txlock=immediate takes the write lock at
			// the first write, which can find it busy: then all wait.
			_ = tx.Rollback()
			if busy(err) {
				b.requeue(append(run, r))
				time.Sleep(10 * time.Millisecond)
			} else {
				r.done <- closedErr(err)
				b.requeue(run)
			}
			return true
		}
		run = append(run, r)
	}
	err = closedErr(tx.Commit())
	if err != nil && len(run) > 1 && !errors.Is(err, idem.ErrClosed) {
		// A check deferred to COMMIT (a deferred foreign key of the
		// caller's schema) fails the whole transaction: run the writes
		// again one a transaction, so that only the guilty one fails.
		b.solo = len(run)
		b.requeue(run)
		return true
	}
	for _, r := range run {
		r.done <- err
	}
	return b.more()
}

// begin begins a write transaction, which takes SQLite's write lock at
// once (Open's _txlock=immediate). Another process may hold the lock for
// longer than the busy timeout: begin tries again, with a backoff, for as
// long as a caller waits, and returns a nil tx once none does.
func (b *Backend) begin() (*sql.Tx, error) {
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		tx, err := b.db.BeginTx(context.Background(), nil)
		if err == nil || !busy(err) {
			return tx, err
		}
		if !b.live() {
			return nil, nil
		}
		time.Sleep(wait)
	}
}
