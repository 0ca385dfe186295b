package idem

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// Options configure a Store. The zero value is ready to use: outcomes are
// kept in memory for 24 hours. Options are read once by New; changing them
// afterwards has no effect.
type Options struct {
	// TTL is how long a final outcome is remembered and replayed. After it,
	// the key may be used afresh. Choose it from the longest window in which
	// a retry can arrive, not from storage cost. Zero or negative means 24
	// hours; more than a century (math.MaxInt64 for "for ever") means a
	// century, which every backend can store.
	TTL time.Duration

	// SweepInterval is how often a background goroutine removes expired
	// outcomes from memory and from the Backend. Expiry is also checked on
	// every lookup, so the sweeper bounds storage, never correctness. Zero
	// means one minute, or the TTL if that is shorter, but never more often
	// than once a second (a 1 ms TTL must not run a 1 kHz sweeper); a
	// positive value is used as it is; negative means no background
	// sweeper (call Store.Sweep yourself).
	SweepInterval time.Duration

	// MaxKeys bounds the keys held in memory, in flight or remembered (with a
	// Backend: in flight, or pinned while the backend cannot record their
	// outcome). When it is reached, a new key gets ErrFull while known keys
	// still replay (with a Backend, from the backend); no live key is
	// evicted. Zero means 100,000: without a Backend, about 174 MB of heap
	// when each outcome is a 1 KiB HTTP response (bench/README.md gives the
	// cost per key of each backend). Negative means no bound, for a store
	// whose callers are all trusted to bound their own keys.
	//
	// With a Backend, what the backend remembers is bounded by the rate of
	// new keys times the TTL, not by MaxKeys; idemhttp and idemgrpc bound
	// it per client with a quota (ScopeQuota).
	MaxKeys int

	// ExecutionTimeout bounds the context that fn runs under. A fn that fails
	// with it has failed before commit: its key is released. It also bounds
	// how long Close waits for executions in flight, for an fn that honours
	// its context. Zero or negative means no bound.
	ExecutionTimeout time.Duration

	// Now returns the current time, for TTL expiry in memory and in a
	// backend local to this process (bolt). A shared backend ignores it and
	// uses its server's clock. Tests inject a fake clock here instead of
	// sleeping. Nil means time.Now.
	Now func() time.Time

	// Fingerprint identifies a payload, to detect a key reused for a
	// different request. It must be safe for concurrent use and give equal
	// fingerprints for payloads that mean the same request. Nil means
	// DefaultFingerprint.
	Fingerprint func(payload any) (Fingerprint, error)

	// Backend keeps records durably: across restarts (bolt, sqlite) or
	// across processes and machines (postgres, mysql, redis). With one, memory holds only
	// the keys in flight in this process, and every remembered outcome lives
	// in the backend. The Store does not close it. Nil means memory only.
	Backend backend.Backend

	// Codec turns results into bytes for the Backend. Nil means JSONCodec.
	Codec Codec

	// Lease is how long a durable claim holds without renewal, by the
	// backend's clock (the database's, for a shared backend). While fn
	// runs, the store renews it every quarter of that; a claim whose lease
	// lapsed, because its owner died or stalled, is interrupted. A lapse
	// alone is no proof (a clock can step): another store takes a lapsed
	// claim for interrupted only once it has seen it go unrenewed for its
	// own whole Lease on its own monotonic clock (past any trust an owner
	// cut off from the backend still has), so stores that share a Backend
	// must use one Lease; a claim the backend still holds, seen unrenewed
	// for a whole Lease (its owner's, if the record shows a longer one), is
	// taken for a dead owner's. The owner
	// measures the lease on its own monotonic clock from when each request
	// left and stops trusting it a tenth of the lease early: fn's context
	// is then cancelled (ErrLeaseLost), and its outcome is refused if
	// another owner took the key. Zero means 30 seconds; more than a
	// century means a century.
	Lease time.Duration

	// SettleTimeout bounds how long the store keeps trying to settle a
	// backend write that failed or whose reply was lost (recording an
	// outcome, releasing a key): it tries again, on the fresh connection
	// the client library opens, and reads the record back to learn from
	// the claim's token whether an earlier try landed. Only then is an
	// outcome reported as not recorded. Zero or negative means 10 seconds.
	SettleTimeout time.Duration

	// RetryInterrupted makes the store treat an interrupted key (claimed by
	// an owner that stopped before recording an outcome) as failed before
	// commit, and run fn again. Only for operations that are safe to repeat
	// or that check for their own earlier effect. False means such a key
	// returns ErrOutcomeUnknown until Forget clears it.
	RetryInterrupted bool

	// Resume makes operations resumable, with a Backend that records steps
	// (backend.Stepper: bolt, sqlite, postgres, mysql, redis). With no Backend, or
	// one that does not record steps, every RunOnce and Begin fails with
	// an error saying so, rather than run without the resumption asked
	// for. Each step's outcome (Step) is recorded under the key as it
	// finishes. A key whose operation was interrupted (its process died),
	// or failed with an ordinary error after a step, stays at its last
	// recovery point (it is not released), and the next call takes it over
	// and runs fn again from the start: the recorded steps return their
	// outcomes without running, and the rest run. An operation interrupted
	// before its first step so runs again whole, as with RetryInterrupted:
	// set Resume for operations whose side effects are all in steps, or
	// safe to repeat. False means Step records nothing, and every key
	// behaves as documented above.
	Resume bool

	// Observer is told what the store does, for metrics and traces
	// (package idemotel makes one for OpenTelemetry). Nil means none, at no
	// cost.
	Observer *Observer

	// Logger receives what the store cannot return to a caller, such as a
	// panic recovered inside the background sweeper. Nil means slog.Default().
	Logger *slog.Logger
}

const (
	defaultTTL           = 24 * time.Hour
	defaultMaxKeys       = 100_000
	defaultSweepInterval = time.Minute
	minDefaultSweep      = time.Second
	defaultLease         = 30 * time.Second
	defaultSettleTimeout = 10 * time.Second

	// longest bounds TTL and Lease: instants a century ahead still fit in
	// every backend's representation (Unix nanoseconds end in 2262).
	longest = 100 * 365 * 24 * time.Hour
)

// guardedClock returns now, with a panic in it (a clock is the user's
// code) logged and answered by the system clock, so that it can neither
// crash the process from a goroutine of the store's nor leave a key in
// flight half-settled.
func guardedClock(now func() time.Time, logger *slog.Logger) func() time.Time {
	return func() (t time.Time) {
		returned := false
		defer guard(&returned, func(v any) {
			logger.Error("idem: Options.Now panicked; the system clock answers instead", "panic", v)
			t = time.Now()
		}, nil)
		t = now()
		returned = true
		return t
	}
}

// guardedFingerprint returns fp, with a panic in it (the user's code) an
// error, which the Store answers as an invalid payload.
func guardedFingerprint(fp func(any) (Fingerprint, error)) func(any) (Fingerprint, error) {
	return func(payload any) (f Fingerprint, err error) {
		returned := false
		defer guard(&returned, func(v any) { f, err = Fingerprint{}, fmt.Errorf("idem: Options.Fingerprint panicked: %v", v) }, nil)
		f, err = fp(payload)
		returned = true
		return f, err
	}
}

// check returns why o cannot be run as asked, or nil.
func (o Options) check() error {
	if !o.Resume {
		return nil
	}
	if !recordsSteps(o.Backend) {
		return fmt.Errorf("idem: Options.Resume needs a Backend that records steps (a backend.Stepper); %T is not one", o.Backend)
	}
	return nil
}

// recordsSteps reports whether b is a backend.Stepper, looking through
// wrappers that say what they wrap (an Unwrap method, as idemtest.Faulty
// has), since a wrapper may pass Stepper calls to a backend that is not one.
func recordsSteps(b backend.Backend) bool {
	for b != nil {
		if _, ok := b.(backend.Stepper); !ok {
			return false
		}
		w, ok := b.(interface{ Unwrap() backend.Backend })
		if !ok {
			return true
		}
		b = w.Unwrap()
	}
	return false
}

// withDefaults returns o with every zero field replaced by its default.
func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		o.TTL = defaultTTL
	}
	o.TTL = min(o.TTL, longest)
	if o.SweepInterval == 0 {
		o.SweepInterval = max(min(defaultSweepInterval, o.TTL), minDefaultSweep)
	}
	switch {
	case o.MaxKeys == 0:
		o.MaxKeys = defaultMaxKeys
	case o.MaxKeys < 0:
		o.MaxKeys = 0 // the table's "unbounded"
	}
	if o.ExecutionTimeout < 0 {
		o.ExecutionTimeout = 0
	}
	userClock := o.Now != nil
	if !userClock {
		o.Now = time.Now
	}
	if o.Fingerprint == nil {
		o.Fingerprint = DefaultFingerprint
	} else {
		o.Fingerprint = guardedFingerprint(o.Fingerprint)
	}
	if o.Lease <= 0 {
		o.Lease = defaultLease
	}
	o.Lease = min(o.Lease, longest)
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = defaultSettleTimeout
	}
	if o.Codec == nil {
		o.Codec = JSONCodec{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if userClock {
		o.Now = guardedClock(o.Now, o.Logger)
	}
	return o
}
