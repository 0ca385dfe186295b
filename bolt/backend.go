// Package bolt is an backend.Backend in a single bbolt file: restart-safe and
// crash-safe for one process.
//
// Every write is durable (fsynced) before it returns: a claim before fn runs,
// an outcome before RunOnce answers. Concurrent writes share commits: one
// goroutine takes every write that is waiting and commits them together, so
// a lone caller pays one fsync per write and many callers share each fsync.
//
// A key claimed when the process died is found pending when the file is next
// opened; Open marks it interrupted, and the Store answers
// idem.ErrOutcomeUnknown for it until it is forgotten.
//
// Size: bbolt never gives pages back to the file system; the pages a Sweep
// frees are reused by later writes, and every commit writes the list of
// them (8 bytes a free page), so a file that a large sweep left mostly free
// writes more per key until it fills again. To shrink it, compact it while
// no process has it open, with bbolt's own tool, and move the copy into
// place:
//
//	go run go.etcd.io/bbolt/cmd/bbolt@v1.4.3 compact -o idem.db.compact idem.db
//	mv idem.db.compact idem.db
//
// The copy holds every record, and is checked in full at its first Open (it
// bears no clean-stop stamp: see Options.Check).
package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/paging"
	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	// ErrLocked is returned by Open when another process, or another Open in
	// this one, holds the file for longer than Options.LockTimeout.
	ErrLocked = errors.New("bolt: database file is locked by another process")

	// ErrCorrupt is returned when the file or a record in it is damaged:
	// truncated, with meta pages that fail their checksum, or with pages or
	// records that cannot be read.
	ErrCorrupt = errors.New("bolt: database is corrupt")

	// ErrNotIdem is returned by Open for a bbolt database that idem did not
	// create, so that a wrong path never gets written into, and, with
	// Options.ReadOnly, for an empty file.
	ErrNotIdem = errors.New("bolt: not an idem database")

	// ErrReadOnly is returned by every write of a Backend opened with
	// Options.ReadOnly.
	ErrReadOnly = errors.New("bolt: database opened read-only")

	// ErrTooLarge is returned when a record would be larger than
	// MaxRecordSize (an outcome whose encoded result is that large): it is
	// not written, and in RunOnceTx the caller's writes are rolled back
	// with it.
	ErrTooLarge = errors.New("bolt: record too large")
)

var (
	bucketMeta    = []byte("idem.meta")
	bucketRecords = []byte("idem.records") // key -> backend.Record.MarshalBinary
	bucketExpiry  = []byte("idem.expiry")  // 8-byte big-endian ExpiresAt (Unix ns) + key -> empty: completed records, soonest first
	bucketPending = []byte("idem.pending") // 8-byte big-endian CreatedAt (Unix ns) + key -> empty: claims not yet settled

	formatKey     = []byte("format")
	formatVersion = []byte{1}
)

// testHookAfterCheck, if set, runs between Open's check and bbolt.Open,
// for the tests of a file replaced in between.
var testHookAfterCheck func()

// testHookBeforeComplete, if set, runs as Complete starts, before anything is
// written. Crash tests use it to stop a process after fn returned and before
// its outcome is recorded.
var testHookBeforeComplete func()

// Backend is an backend.Backend over one bbolt file. Open it with Open and close
// it after the Stores that use it. It is safe for concurrent use.
type Backend struct {
	db          *bbolt.DB
	interrupted int  // records found pending by Open and marked interrupted
	readOnly    bool // Options.ReadOnly: no committer, every write refused
	// verified: Open checked the file, in full or as a clean stop's, so
	// Close may stamp it clean (clean.go); not with CheckNever.
	verified bool
	file     *os.File // the descriptor bbolt holds the file open with
	// guard, if not nil, checks the pages of idem's buckets before bbolt
	// reads them: Open did not check them all (guard.go).
	guard *guard

	mu     sync.RWMutex
	closed bool          // guarded by mu
	reqs   chan *request // sent on under mu.RLock while open; closed by Close
	exited chan struct{} // closed when the committer has drained reqs
}

var _ backend.Backend = (*Backend)(nil)

// Open opens, or creates, the database file at path. A nil opts means the
// defaults. A file that is not a bbolt database, or is truncated or corrupt,
// is an error (never a panic or a crash), and so is a file another process
// holds for longer than opts.LockTimeout.
//
// Records that an earlier process left pending are marked interrupted.
//
// How much of the file Open checks first depends on how it was last
// closed, and on opts.Check: see Check.
func Open(path string, opts *Options) (*Backend, error) {
	o := opts.withDefaults()
	if o.ReadOnly {
		return openReadOnly(path, o)
	}
	db, file, g, err := openChecked(path, o)
	if err != nil {
		return nil, err
	}
	n, err := initialize(db, g)
	if errors.Is(err, berrors.ErrIncompatibleValue) { // a bucket where a value belongs, or the reverse
		err = fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: %s: %w", path, err)
	}
	b := &Backend{
		db:          db,
		file:        file,
		verified:    o.Check != CheckNever,
		guard:       g,
		interrupted: n,
		reqs:        make(chan *request, o.MaxBatch),
		exited:      make(chan struct{}),
	}
	go committer(db, b.reqs, o.MaxBatch, b.exited)
	return b, nil
}

// openChecked checks the file as o.Check says, opening it with bbolt once
// the pages bbolt reads at once have passed. The check runs under the
// file's lock (holdLock); if another process wrote the file between the
// check and bbolt's taking of the lock, it checks again. It returns a
// guard for the pages it left unchecked, if it left any.
func openChecked(path string, o Options) (*bbolt.DB, *os.File, *guard, error) {
	for attempt := 0; ; attempt++ {
		db, file, g, changed, err := openCheckedOnce(path, o)
		if !changed || err != nil {
			return db, file, g, err
		}
		db.Close()
		if attempt == 2 {
			return nil, nil, nil, fmt.Errorf("%w: %s: another process wrote or replaced the file each time it was checked", ErrLocked, path)
		}
	}
}

// openCheckedOnce is one attempt of openChecked; changed reports that the
// file's newest transaction was not the one checked.
func openCheckedOnce(path string, o Options) (db *bbolt.DB, file *os.File, g *guard, changed bool, err error) {
	first := scopeOpen
	if o.Check == CheckNever {
		first = scopeReads
	}
	if o.Check == CheckAlways {
		first = scopeAll
	}
	locked, err := holdLock(path, o.ReadOnly, o.LockTimeout)
	if err != nil {
		return nil, nil, nil, false, err
	}
	var m meta
	var checked bool
	var before os.FileInfo
	if locked != nil {
		m, checked, err = checkFile(path, first, locked)
		if err == nil {
			before, err = locked.Stat()
		}
		locked.Close() // drops the lock, for bbolt to take
		if err != nil {
			return nil, nil, nil, false, err
		}
	}
	if testHookAfterCheck != nil {
		testHookAfterCheck()
	}
	db, file, err = openDB(path, o)
	if err != nil {
		return nil, nil, nil, false, err
	}
	fail := func(err error) (*bbolt.DB, *os.File, *guard, bool, error) {
		db.Close()
		return nil, nil, nil, false, err
	}
	// bbolt must have opened the file checked, as it was: not one renamed
	// over it, nor one another process wrote in between. A file that was
	// missing or empty must be bbolt's new one.
	var txid uint64
	var size int64
	if err := view(db, func(tx *bbolt.Tx) error { txid, size = uint64(tx.ID()), tx.Size(); return nil }); err != nil {
		return fail(fmt.Errorf("bolt: %s: %w", path, err))
	}
	now, err := file.Stat()
	if err != nil {
		return fail(err)
	}
	switch {
	case m.pgid == 0 && size > int64(4*db.Info().PageSize): // more than bbolt's first four pages
		return db, file, nil, true, nil
	case m.pgid != 0 && (txid != m.txid || !os.SameFile(before, now)):
		return db, file, nil, true, nil
	}
	if !checked && o.Check != CheckNever { // a clean stop's file
		none, err := nothingPending(db)
		if err != nil {
			return fail(fmt.Errorf("bolt: %s: %w", path, err))
		}
		if !none {
			// Open reads the pending claims' records, whose pages the
			// check above left alone. Nothing has written the file
			// since (bbolt holds its lock): the pages checked now are
			// the ones bbolt opened.
			if _, _, err := checkFile(path, scopeAll, file); err != nil {
				return fail(err)
			}
			checked = true
		}
	}
	if checked {
		if err := checkRecords(db); err != nil {
			return fail(fmt.Errorf("bolt: %s: %w", path, err))
		}
	}
	if m.pgid != 0 { // a new file's pages are all bbolt's
		// Even a file checked whole gets a guard: bbolt has been seen to
		// make, by its own writes over a damaged page the check let
		// through, a tree that its cursor goes round for ever. Its pages
		// need no second check, only the guard's walk (its depth, the
		// order and ranges of keys).
		unchecked := m.pgid
		if checked {
			unchecked = 0
		}
		g = newGuard(file, uint64(db.Info().PageSize), unchecked)
	}
	return db, file, g, false, nil
}

// openDB opens the file with bbolt, and returns the *os.File bbolt reads
// and writes it through.
func openDB(path string, o Options) (db *bbolt.DB, file *os.File, err error) {
	// bbolt does not close the file if it panics on a damaged one; keep hold
	// of it to close it, and so drop its lock, here.
	defer func() {
		if err != nil && db == nil && file != nil {
			file.Close()
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverCorrupt(&err)
	db, err = bbolt.Open(path, o.FileMode, &bbolt.Options{
		Timeout:      o.LockTimeout,
		FreelistType: bbolt.FreelistMapType,
		// The freelist is written at every commit, which costs a commit
		// 8 bytes per free page (some 250 KB a new key after a sweep freed
		// half of a 1.8 GB file: compact it, see the package doc).
		// NoFreelistSync would spare that, but bbolt then rebuilds the
		// list by reading every page in use at each rolled-back write
		// transaction, and the committer rolls back for every fn that
		// fails in RunOnceTx or Update (bench/README.md, "At scale").
		NoSync:   o.noSync,
		ReadOnly: o.ReadOnly,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, fmt.Errorf("%w: %s (waited %v)", ErrLocked, path, o.LockTimeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	case err != nil:
		return nil, nil, fmt.Errorf("bolt: opening %s: %w", path, err)
	}
	return db, file, nil
}

// openReadOnly opens an existing idem file for reading only: it writes
// nothing, not even the marks of interrupted claims, so it can inspect a
// file on a full disk, and it shares the file with other read-only
// openers.
func openReadOnly(path string, o Options) (*Backend, error) {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, err
	case fi.Size() == 0:
		return nil, fmt.Errorf("%w: %s is empty", ErrNotIdem, path)
	}
	db, file, g, err := openChecked(path, o)
	if err != nil {
		return nil, err
	}
	err = view(db, func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: it has no %s bucket", ErrNotIdem, bucketMeta)
		}
		if v := meta.Get(formatKey); !bytes.Equal(v, formatVersion) {
			return fmt.Errorf("%w: unknown format %x", ErrNotIdem, v)
		}
		for _, name := range [][]byte{bucketRecords, bucketExpiry, bucketPending} {
			if tx.Bucket(name) == nil {
				return fmt.Errorf("%w: it has no %s bucket", ErrNotIdem, name)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: %s: %w", path, err)
	}
	return &Backend{db: db, file: file, guard: g, readOnly: true}, nil
}

// initialize makes the buckets of a new file, checks an old one is idem's,
// and marks the claims an earlier process left pending as interrupted,
// returning how many it marked. g is Open's guard, if any.
func initialize(db *bbolt.DB, g *guard) (interrupted int, err error) {
	err = update(db, func(tx *bbolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta == nil {
			if k, _ := tx.Cursor().First(); k != nil {
				if bytes.HasPrefix(k, []byte("idem.")) { // idem's file, its meta bucket lost
					return fmt.Errorf("%w: bucket %s is missing", ErrCorrupt, bucketMeta)
				}
				return fmt.Errorf("%w: it holds bucket %q", ErrNotIdem, k)
			}
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(formatKey, formatVersion); err != nil {
				return err
			}
		} else if v := meta.Get(formatKey); !bytes.Equal(v, formatVersion) {
			return fmt.Errorf("%w: unknown format %x", ErrNotIdem, v)
		}
		for _, name := range [][]byte{bucketRecords, bucketExpiry, bucketPending} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		// The pending bucket's pages were checked by Open, whatever its
		// Check; the records bucket's are guarded.
		pending, records := tx.Bucket(bucketPending), guardedBucket(tx, bucketRecords, g)
		var keys [][]byte
		w := newWalk(tx, bucketPending)
		if err := pending.ForEach(func(k, _ []byte) error {
			if err := w.step(k); err != nil {
				return err
			}
			keys = append(keys, bytes.Clone(k))
			return nil
		}); err != nil {
			return err
		}
		for _, pk := range keys {
			if len(pk) > 8 {
				// A record that cannot be read is left as it is, for the
				// operator to forget; one that is not pending is settled.
				v, err := records.Get(pk[8:])
				if err != nil {
					return err
				}
				rec, err := decode(pk[8:], v)
				if err == nil && rec.State == backend.StatePending {
					// Its owner is proven dead: it held the file's lock.
					rec = rec.WithOwnerDead()
					if err := put(records, rec); err != nil {
						return err
					}
					interrupted++
				}
			}
			if err := pending.Delete(pk); err != nil {
				return err
			}
		}
		return nil
	})
	return interrupted, err
}

// Interrupted returns how many records Open found left pending by an earlier
// process and marked interrupted.
func (b *Backend) Interrupted() int { return b.interrupted }

// Close waits for writes in flight, then closes the file. Later calls on b
// return idem.ErrClosed; Close itself is idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.readOnly {
		b.mu.Unlock()
		return b.db.Close()
	}
	close(b.reqs)
	b.mu.Unlock()
	<-b.exited
	// A stamp that fails to be written costs only the next Open a full
	// check.
	if b.verified {
		_ = stamp(b.file) // through bbolt's own descriptor: the file it holds, not the path's
	}
	return b.db.Close()
}

// write runs o in a shared, durable write transaction and returns its result
// once committed. A caller whose ctx ends while its write waits for the
// committer (behind a long Update or RunOnceTx, say) takes it back and is
// refused, with nothing written; once the committer has taken it, the
// write is waited for even if ctx ends, so that the caller always learns
// whether it took effect.
func (b *Backend) write(ctx context.Context, o op) error {
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err) // nothing sent: the Store need not watch for it to land
	}
	if err := b.usable(ctx); err != nil {
		return err
	}
	r := &request{op: o, done: make(chan error, 1)}
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
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		if r.turn.CompareAndSwap(turnQueued, turnWithdrawn) {
			return backend.Refuse(ctx.Err())
		}
		return <-r.done
	}
}

// read runs fn in a read transaction.
func (b *Backend) read(ctx context.Context, fn func(*bbolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err)
	}
	if ctx.Value(inTx{}) == b {
		return backend.Refuse(errNested)
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return idem.ErrClosed
	}
	return view(b.db, fn)
}

func (b *Backend) Claim(ctx context.Context, rec backend.Record, now time.Time, lease time.Duration) (backend.Record, bool, error) {
	// Most claims of a known key are replays: answer them from a read
	// transaction, which costs no commit. Only a claim that may write goes
	// to the committer, which looks again under the write lock.
	// A claim that fails before its write (a damaged record, a ctx that
	// ended) wrote nothing, and says so (backend.Refuse): the Store need
	// not watch it for a late landing, nor hold Close up to release it.
	if old, ok, err := b.Get(ctx, rec.Key, now); err != nil {
		return old, false, backend.Refuse(err)
	} else if ok {
		return old, false, nil
	}
	rec = backend.Record{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: rec.Token, State: backend.StatePending, CreatedAt: now}
	if lease > 0 {
		rec.LeaseUntil = now.Add(lease)
	}
	enc, err := rec.MarshalBinary()
	if err != nil {
		return backend.Record{}, false, err
	}
	key := []byte(rec.Key)
	var found backend.Record
	won := false
	err = b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		v, err := records.Get(key)
		if err != nil {
			return backend.Refuse(err)
		}
		if v != nil {
			old, err := decode(key, v)
			if err != nil {
				return backend.Refuse(err)
			}
			if seen, ok := old.SeenAt(now); ok {
				found, won = seen, false
				return nil
			}
			if err := b.bucket(tx, bucketExpiry).Delete(expiryKey(old)); err != nil {
				return err
			}
		}
		if err := records.Put(key, enc); err != nil {
			return err
		}
		found, won = rec, true
		return b.bucket(tx, bucketPending).Put(pendingKey(rec), nil)
	})
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// write gives up on ctx only while the committer has not taken
		// the request: nothing was written.
		err = backend.Refuse(err)
	}
	if err != nil {
		return backend.Record{}, false, err
	}
	return found, won, nil
}

func (b *Backend) Complete(ctx context.Context, rec backend.Record, now time.Time, ttl time.Duration) error {
	if testHookBeforeComplete != nil {
		testHookBeforeComplete()
	}
	key := []byte(rec.Key)
	return b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		claim, err := checkOwner(records, key, rec.Token)
		if err != nil {
			return err
		}
		done := claim
		done.State, done.ExpiresAt, done.LeaseUntil = backend.StateCompleted, now.Add(ttl), time.Time{}
		done.Value, done.Failed, done.ErrMsg = rec.Value, rec.Failed, rec.ErrMsg
		err = put(records, done)
		if errors.Is(err, ErrTooLarge) && len(done.Steps) > 0 {
			// The outcome is what replays now: the steps keep their names
			// and times, not their results, rather than leave the operation
			// unable to complete.
			done.Steps = withoutValues(done.Steps)
			err = put(records, done)
		}
		if err != nil {
			return err
		}
		if err := b.bucket(tx, bucketPending).Delete(pendingKey(claim)); err != nil {
			return err
		}
		return b.bucket(tx, bucketExpiry).Put(expiryKey(done), nil)
	})
}

func (b *Backend) Release(ctx context.Context, key, token string) error {
	k := []byte(key)
	return b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		claim, err := checkOwner(records, k, token)
		if err != nil {
			return err
		}
		if err := records.Delete(k); err != nil {
			return err
		}
		return b.bucket(tx, bucketPending).Delete(pendingKey(claim))
	})
}

// checkOwner returns key's record if it is an unsettled claim held by token,
// and an error matching backend.ErrNotOwner otherwise.
func checkOwner(records *bucket, key []byte, token string) (backend.Record, error) {
	v, err := records.Get(key)
	if err != nil {
		return backend.Record{}, err
	}
	if v == nil {
		return backend.Record{}, fmt.Errorf("%w: key %q has no record", backend.ErrNotOwner, key)
	}
	old, err := decode(key, v)
	if err != nil {
		return backend.Record{}, err
	}
	if !old.Settleable(token) {
		return backend.Record{}, fmt.Errorf("%w: key %q is %s under another claim", backend.ErrNotOwner, key, old.State)
	}
	return old, nil
}

// checkLiveOwner is checkOwner for a write that only a live claim may
// make: the claim must still be pending, its lease unlapsed at now.
func checkLiveOwner(records *bucket, key []byte, token string, now time.Time) (backend.Record, error) {
	claim, err := checkOwner(records, key, token)
	if err != nil {
		return backend.Record{}, err
	}
	if !claim.HeldBy(token, now) {
		return backend.Record{}, fmt.Errorf("%w: key %q is %s, its lease until %v", backend.ErrNotOwner, key, claim.State, claim.LeaseUntil)
	}
	return claim, nil
}

func (b *Backend) Get(ctx context.Context, key string, now time.Time) (backend.Record, bool, error) {
	var rec backend.Record
	found := false
	err := b.read(ctx, func(tx *bbolt.Tx) error {
		v, err := b.bucket(tx, bucketRecords).Get([]byte(key))
		if err != nil || v == nil {
			return err
		}
		if rec, err = decode([]byte(key), v); err != nil {
			return err
		}
		rec, found = b.seen(rec).SeenAt(now)
		return nil
	})
	return rec, found, err
}

// seen returns rec as this Backend reports it. Opened read-only, it reports
// a pending record as interrupted: no writer can hold the file while a
// reader does, so its owner is gone, as a writable Open would record.
func (b *Backend) seen(rec backend.Record) backend.Record {
	if b.readOnly {
		return rec.WithOwnerDead()
	}
	return rec
}

func (b *Backend) Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error {
	k := []byte(key)
	return b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		// A lapsed lease is renewed too: its owner is alive (backend.Backend).
		claim, err := checkOwner(records, k, token)
		if err != nil {
			return err
		}
		if !claim.ClaimedBy(token) {
			return fmt.Errorf("%w: key %q is %s", backend.ErrNotOwner, key, claim.State)
		}
		claim.LeaseUntil = now.Add(lease)
		return put(records, claim)
	})
}

func (b *Backend) Forget(ctx context.Context, key string, now time.Time) error {
	k := []byte(key)
	return b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		v, err := records.Get(k)
		if err != nil || v == nil {
			return err
		}
		old, err := decode(k, v)
		if err != nil {
			return records.Delete(k) // unreadable: the operator may still clear it
		}
		switch {
		case old.Live(now):
			return fmt.Errorf("%w: key %q is claimed and not yet settled", idem.ErrInProgress, key)
		case old.State == backend.StatePending:
			if err := b.bucket(tx, bucketPending).Delete(pendingKey(old)); err != nil {
				return err
			}
		case old.State == backend.StateCompleted:
			if err := b.bucket(tx, bucketExpiry).Delete(expiryKey(old)); err != nil {
				return err
			}
		}
		return records.Delete(k)
	})
}

// Sweep deletes up to limit expired records, walking the expiry index from
// its start: the work is proportional to what expired, not to the size of
// the file. It deletes them sweepBatch at a time, each chunk one write
// among the others of its commit, so that claims made while a large sweep
// runs wait for a small commit rather than for the whole sweep's.
func (b *Backend) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	swept := 0
	for swept < limit {
		want := min(limit-swept, sweepBatch)
		n, err := b.sweepChunk(ctx, now, want)
		swept += n
		if err != nil || n < want {
			return swept, err
		}
	}
	return swept, nil
}

// sweepBatch bounds the records one commit of a sweep deletes.
const sweepBatch = 128

// sweepChunk deletes up to limit expired records in one write.
func (b *Backend) sweepChunk(ctx context.Context, now time.Time, limit int) (int, error) {
	n := 0
	err := b.write(ctx, func(tx *bbolt.Tx) error {
		n = 0
		expiry, records := b.bucket(tx, bucketExpiry), b.bucket(tx, bucketRecords)
		var due [][]byte
		if err := expiry.ascend(nil, func(k, _ []byte) bool {
			if len(due) == limit || len(k) <= 8 || now.Before(expiryTime(k)) {
				return false
			}
			due = append(due, bytes.Clone(k))
			return true
		}); err != nil {
			return err
		}
		for _, k := range due {
			// Delete the record only if this entry is still its expiry: an
			// entry the record has outlived must not take a newer claim.
			v, err := records.Get(k[8:])
			if err != nil {
				return err
			}
			if v != nil {
				if rec, err := decode(k[8:], v); err == nil && rec.State == backend.StateCompleted && bytes.Equal(expiryKey(rec), k) {
					if err := records.Delete(k[8:]); err != nil {
						return err
					}
				}
			}
			if err := expiry.Delete(k); err != nil {
				return err
			}
		}
		n = len(due)
		return nil
	})
	if err != nil {
		return 0, err // the chunk's deletions were not committed (a failed write or commit is rolled back): none counts
	}
	return n, nil
}

// Each calls fn for every record, in key order, stopping at fn's first
// error. It reads a page of records in each read transaction and calls fn
// after that transaction ends, so fn may call b, and a long listing holds
// no transaction open (one that did would keep the file from growing).
func (b *Backend) Each(ctx context.Context, fn func(backend.Record) error) error {
	return paging.Each(ctx, b.page, fn)
}

// page reads up to limit records with keys after after, in key order.
func (b *Backend) page(ctx context.Context, after string, limit int) ([]backend.Record, error) {
	var page []backend.Record
	err := b.read(ctx, func(tx *bbolt.Tx) error {
		var err error
		aerr := b.bucket(tx, bucketRecords).ascend([]byte(after), func(k, v []byte) bool {
			if string(k) == after {
				return true
			}
			var rec backend.Record
			if rec, err = decode(k, v); err != nil {
				return false
			}
			page = append(page, b.seen(rec))
			return len(page) < limit
		})
		if err != nil {
			return err
		}
		return aerr
	})
	return page, err
}

// expiryKey is rec's key in the expiry index, pendingKey its key in the
// pending index: a time, then the record's key.
func expiryKey(rec backend.Record) []byte  { return timeKey(rec.ExpiresAt, rec.Key) }
func pendingKey(rec backend.Record) []byte { return timeKey(rec.CreatedAt, rec.Key) }

// timeKey puts t first, big-endian, so that byte order is time order: a
// sweep finds what expired at the start of its index, and new entries land
// on the index's last page instead of on a random one, which keeps each
// commit's page writes few.
func timeKey(t time.Time, key string) []byte {
	k := make([]byte, 8, 8+len(key))
	binary.BigEndian.PutUint64(k, uint64(t.UnixNano()))
	return append(k, key...)
}

func expiryTime(k []byte) time.Time {
	return time.Unix(0, int64(binary.BigEndian.Uint64(k)))
}

func decode(key, v []byte) (backend.Record, error) {
	var rec backend.Record
	switch {
	case v == nil:
		return rec, fmt.Errorf("%w: no record for %q", ErrCorrupt, key)
	case len(v) > MaxRecordSize:
		return rec, fmt.Errorf("%w: record %q claims %d bytes, more than %d", ErrCorrupt, key, len(v), MaxRecordSize)
	}
	if err := rec.UnmarshalBinary(v); err != nil {
		return rec, fmt.Errorf("%w: record %q: %w", ErrCorrupt, key, err)
	}
	return rec, nil
}

// put writes rec, unless it is larger than MaxRecordSize: a record that
// size would read as damage, and the file would no longer open.
func put(records *bucket, rec backend.Record) error {
	enc, err := rec.MarshalBinary()
	if err != nil {
		return err
	}
	if n := len(rec.Key) + len(enc); n > MaxRecordSize {
		return backend.Refuse(fmt.Errorf("%w: key %q: a record of %d bytes, more than %d", ErrTooLarge, rec.Key, n, MaxRecordSize))
	}
	return records.Put([]byte(rec.Key), enc)
}
