package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// These errors are part of the contract between a Store and its Backend.
// Package idem re-exports ErrInProgress and ErrClosed, so that a caller sees
// one sentinel whichever layer refused it.
var (
	// ErrNotOwner is returned by Complete, Release and Renew when the key's
	// record no longer belongs to the token presented: it is gone,
	// completed, or claimed again by another owner. A stale owner can
	// therefore never overwrite a newer claim.
	ErrNotOwner = errors.New("idem: the claim is not held by this token")

	// ErrInProgress is returned by Forget when the key is claimed and its
	// lease holds: its owner may still record an outcome.
	ErrInProgress = errors.New("idem: operation in progress")

	// ErrClosed is returned by a Backend's methods once it is closed.
	ErrClosed = errors.New("idem: store is closed")

	// ErrRefused is matched by the error of a call that a Backend refused
	// before it wrote or sent anything: one opened read-only, called from
	// inside its own transaction, given a ctx that had already ended, or
	// finding the key's record damaged. Nothing is left to read back, and
	// the Store does not try the call again, as for ErrClosed.
	ErrRefused = errors.New("idem: the backend refused the call")
)

// RecordState is where a key's durable record stands.
type RecordState uint8

const (
	// StatePending: the key is claimed and its owner has not yet recorded
	// an outcome. If its lease has lapsed, the owner is gone and backends
	// report the record as interrupted.
	StatePending RecordState = iota + 1
	// StateCompleted: a final outcome is recorded until ExpiresAt.
	StateCompleted
	// StateInterrupted: the key was claimed by an owner that stopped before
	// recording an outcome, so the operation may or may not have taken
	// effect. It stays until forgotten; it never expires on its own.
	// A record reported interrupted because its lease lapsed keeps its
	// LeaseUntil: a lapse alone is no proof of death (a clock can step),
	// and a Store acts on it only after seeing it go unrenewed. A backend
	// that knows its owner died (bolt at Open: the owner held the file's
	// lock) stores it interrupted with a zero LeaseUntil: proven dead.
	StateInterrupted
)

func (s RecordState) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateCompleted:
		return "completed"
	case StateInterrupted:
		return "interrupted"
	}
	return "invalid"
}

// A Record is one key's durable state, in bytes.
type Record struct {
	Key         string
	Fingerprint [32]byte // of the payload that claimed the key (idem.Fingerprint)
	Token       string   // the claim's ownership token, random per claim
	State       RecordState
	CreatedAt   time.Time // when the key was claimed
	ExpiresAt   time.Time // completed records: when the outcome may be forgotten; zero otherwise
	LeaseUntil  time.Time // pending records: until when the owner's claim holds without renewal; zero for no lease

	// Completed records only: the result encoded by the Store's Codec, and,
	// for an outcome that is a final error, that error's message (stored
	// as it is, or as StorableText makes it).
	Value  []byte
	Failed bool
	ErrMsg string

	// The steps the operation recorded (Stepper), in the order recorded.
	Steps []Step
}

// A Backend keeps records durably, so that what a Store promised outlives
// its process and, for a shared backend, is seen by every process. A nil
// Options.Backend keeps everything in memory.
//
// Every method must be safe for concurrent use by many goroutines (and, for
// a backend shared between processes, by many processes), and atomic: no
// caller ever observes half of one call. When a method that writes returns
// nil, its write is durable: it survives a crash of the process and, as far
// as the storage engine promises, of the machine.
//
// A Backend never interprets Value, Fingerprint or Token; it stores and
// returns them byte for byte. It compares tokens and states only as each
// method below says.
//
// # Time
//
// Leases and expiry decide ownership, so one clock must judge them. The
// methods get durations (a lease, a TTL; a Store sends at most a century)
// and now, the Store's clock
// (Options.Now) at the call. A backend local to one process (memory,
// bbolt) judges by now. A backend shared between machines must not: it
// makes every instant it stores or compares from its server's clock when it
// executes the call (PostgreSQL now(), Redis TIME) and ignores now, so that
// skew between application hosts can never hand a live claim to a second
// owner. Records it returns carry its instants.
//
// Records come back as the backend's clock sees them at the call: a pending
// record whose lease has lapsed is returned with State StateInterrupted (its
// owner is gone), and a completed record that has expired is not returned
// at all.
//
// # Ambiguity
//
// A write whose reply was lost may or may not have landed. The Store
// settles it with the claim's token: it repeats the write or reads the
// record back (Get) and compares the token. So Complete and Release must be
// safe to repeat (a repeat that finds its own write done reports
// ErrNotOwner, which the Store then checks with Get), and Claim may return
// a standing record that holds rec.Token: an earlier attempt of this same
// claim landed, and the caller owns it.
type Backend interface {
	// Claim stores a pending record of rec.Key with rec's Fingerprint and
	// Token, CreatedAt the backend's now and LeaseUntil lease after it (zero
	// for lease 0), if rec.Key has no record or its record is completed and
	// expired, and returns that record and true. Otherwise it stores nothing
	// and returns the standing record and false. The test and the write are
	// one atomic step: of any number of concurrent claims of a key, exactly
	// one wins.
	//
	// With a nil error, a valid answer is, with true, a record with rec's
	// Key, Fingerprint and Token and StatePending; with false, the standing
	// record, with rec's Key, a non-empty Token and State StatePending,
	// StateCompleted or StateInterrupted. Any other answer, such as
	// (Record{}, true, nil), is malformed: a Store reports it as the
	// backend's failure (a *idem.BackendError), never as a claim or a
	// replay. The conformance suite (idemtest.Run) checks every answer it
	// gets.
	Claim(ctx context.Context, rec Record, now time.Time, lease time.Duration) (Record, bool, error)

	// Complete records the outcome in rec (Value, Failed, ErrMsg) for
	// rec.Key, completed and expiring ttl after the backend's now, if the
	// key's record is pending or interrupted and its Token equals rec.Token.
	// The record keeps its Fingerprint, Token and CreatedAt. Otherwise it
	// changes nothing and returns an error matching ErrNotOwner.
	Complete(ctx context.Context, rec Record, now time.Time, ttl time.Duration) error

	// Release deletes key's record if it is pending or interrupted and its
	// Token equals token, so the key may be claimed afresh. Otherwise it
	// changes nothing and returns an error matching ErrNotOwner.
	Release(ctx context.Context, key, token string) error

	// Renew sets the lease of key's pending record to lease after the
	// backend's now, if its Token equals token, whether or not the lease
	// has lapsed: a lease judged lapsed by a clock that stepped forward is
	// still its live owner's, and a Store takes a lapsed claim over only
	// once it has seen it go unrenewed for a while on its own monotonic
	// clock (taking it over changes or deletes the token). Otherwise
	// (another token, a completed record, none) it changes nothing and
	// returns an error matching ErrNotOwner: the claim was lost.
	Renew(ctx context.Context, key, token string, now time.Time, lease time.Duration) error

	// Get returns key's record, and false if there is none or it expired.
	Get(ctx context.Context, key string, now time.Time) (Record, bool, error)

	// Forget deletes key's record, completed or interrupted (or pending with
	// a lapsed lease): the operator's reconciliation. A pending record whose
	// lease holds is refused with an error matching ErrInProgress. An
	// absent key is not an error.
	Forget(ctx context.Context, key string, now time.Time) error

	// Sweep deletes at most limit completed records that have expired,
	// oldest expiry first, and returns how many it deleted. A backend
	// may order by an instant of its own that keeps that order among
	// records given one TTL, as a Store's are (postgres orders by an
	// instant its claim sets, which a Complete of the TTL it assumed
	// leaves as it is),
	// provided that no expired record is ever left behind. Pending and
	// interrupted records are never swept. A limit of zero or less
	// deletes nothing and returns 0 and no error: it never means "no
	// limit", so a caller's arithmetic gone wrong cannot start an
	// unbounded delete.
	Sweep(ctx context.Context, now time.Time, limit int) (int, error)
}

// Refuse returns an error that matches both reason and ErrRefused, with
// reason's message: what a Backend returns for a call it refused without
// writing anything. A reason that is already a refusal is returned as is.
func Refuse(reason error) error {
	if errors.Is(reason, ErrRefused) {
		return reason
	}
	return refusal{reason}
}

type refusal struct{ reason error }

func (r refusal) Error() string   { return r.reason.Error() }
func (r refusal) Unwrap() []error { return []error{r.reason, ErrRefused} }

// Owned turns the result of a token-compared write that changed n records
// into what Complete, Release and Renew return: err if the write failed, an
// error matching ErrNotOwner naming key if it changed nothing, else nil.
func Owned(n int64, err error, key string) error {
	switch {
	case err != nil:
		return err
	case n == 0:
		return fmt.Errorf("%w: key %q", ErrNotOwner, key)
	}
	return nil
}

// A Lister is a Backend that can list its records, for operators' tools
// and idem.Store.Records. bolt, sqlite, postgres, mysql, redis and
// idemtest's MemoryBackend implement it.
type Lister interface {
	Backend

	// Each calls fn with every record the backend holds, in no set order,
	// and stops with fn's first error. Records come as stored: a pending
	// record may have a lapsed lease, which Get would report as
	// interrupted; an expired record may come until it is swept.
	//
	// Each reads in pages of bounded size, each in a short read of its
	// own (a read transaction, a query, a SCAN call), and calls fn with a
	// page's records after that read has ended: fn may call the backend,
	// memory stays flat however many records there are, and a long
	// listing never holds a read open. So a listing is not a snapshot: a
	// record written or deleted while Each runs may come or not, but one
	// present throughout comes at least once.
	Each(ctx context.Context, fn func(Record) error) error
}

// SelfExpiring is implemented by a Backend whose store deletes an expired
// record by itself, as Redis deletes a key past its TTL: the record is gone
// without a Sweep, so the backend's Sweep has nothing to delete and
// returns 0. idemtest's conformance suite judges Sweep by that.
type SelfExpiring interface {
	Backend

	// ExpiresRecords marks the backend; it does nothing.
	ExpiresRecords()
}
