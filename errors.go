package idem

import (
	"errors"
	"fmt"

	"github.com/seed094d4201/idem/backend"
)

// These errors are returned by a Store; test for them with [errors.Is], since
// they usually come wrapped with detail.
var (
	// ErrPayloadMismatch is returned when a key is reused with a payload whose
	// fingerprint differs from the one that first claimed it, while that claim
	// is in flight or its outcome is remembered. The first execution is not
	// disturbed.
	ErrPayloadMismatch = errors.New("idem: key reused with a different payload")

	// ErrInProgress is returned when a key is held by an execution that has
	// not ended. The error also matches what sets each case apart:
	//
	//   - the caller's context ended while it waited (a retry with the
	//     same key later gets the outcome): the context's error;
	//   - the store was closed while it waited: ErrClosed;
	//   - Forget or Resolve, which refuse a held key rather than wait:
	//     ErrKeyHeld;
	//   - a RunOnceTx whose key a RunOnce or Begin holds, outside any
	//     transaction: ErrHeldOutsideTx.
	ErrInProgress = backend.ErrInProgress

	// ErrKeyHeld is returned, matching ErrInProgress too, when Forget or
	// Resolve is asked to change a key in flight in this store, whose
	// outcome this store is still recording, that another Forget or
	// Resolve in this store is changing, or claimed under a live lease
	// elsewhere: an operator's call never waits, and never takes a key
	// from a live owner.
	ErrKeyHeld = fmt.Errorf("%w: refused while the key is held", ErrInProgress)

	// ErrHeldOutsideTx is returned, matching ErrInProgress too, by a
	// RunOnceTx whose key is held by a RunOnce or Begin: their claim is
	// kept outside any transaction, so the transaction cannot wait on it.
	// Use one mode per key.
	ErrHeldOutsideTx = fmt.Errorf("%w: held by a RunOnce outside a transaction", ErrInProgress)

	// ErrOutcomeUnknown is returned when a durable record shows the key was
	// claimed but its owner stopped before recording an outcome, so the
	// operation may or may not have taken effect. Such a key stays in this
	// state until Forget clears it, unless Options.RetryInterrupted lets the
	// store run fn again.
	ErrOutcomeUnknown = errors.New("idem: outcome unknown: the key was claimed but its owner stopped before recording an outcome")

	// ErrNotInterrupted is returned by Resolve when the key is not
	// interrupted: it has no record, or already has an outcome, or changed
	// hands while it was being resolved.
	ErrNotInterrupted = errors.New("idem: the key is not interrupted")

	// ErrInvalidKey is returned when a key is empty, longer than MaxKeyLen
	// bytes, not valid UTF-8, or holds a control character.
	ErrInvalidKey = errors.New("idem: invalid key")

	// ErrInvalidPayload is returned when Options.Fingerprint cannot
	// fingerprint a payload (the default: it has no JSON encoding): the
	// same payload will never be accepted, so a retry cannot help.
	ErrInvalidPayload = errors.New("idem: invalid payload")

	// ErrFull is returned when a new key would take the store past
	// Options.MaxKeys. Keys already held still replay; no live key is ever
	// evicted to make room, since that would reopen the window for a second
	// execution.
	ErrFull = errors.New("idem: store is full")

	// ErrClosed is returned by calls made after Close.
	ErrClosed = backend.ErrClosed

	// ErrReplayed is returned by Ticket.Finish on a ticket that holds a
	// remembered outcome (Ticket.Replayed), and is the cause of that
	// ticket's ended Context: there was no work to do, and work done
	// anyway is not recorded.
	ErrReplayed = errors.New("idem: the ticket holds a replayed outcome: there is no work to do (ask Ticket.Replayed first)")

	// ErrGoexit is returned to the callers that waited on an execution
	// whose fn ended its goroutine (runtime.Goexit, as testing's FailNow
	// does) rather than return. The key is released, as for a panic
	// (PanicError), and the next call runs fn again.
	ErrGoexit = errors.New("idem: fn called runtime.Goexit")
)

var (
	errNilContext = errors.New("idem: nil Context")
	errNilFunc    = errors.New("idem: nil fn")
)

// Final marks err as a definitive outcome of the operation, such as "card
// declined": the store remembers and replays it like a success instead of
// releasing the key for another try. [errors.Is] and [errors.As] still find
// err through the result. Final(nil) is nil.
func Final(err error) error {
	if err == nil || IsFinal(err) {
		return err
	}
	return &finalError{err: err}
}

// IsFinal reports whether err, or any error it wraps, was marked with
// [Final]. It holds for a replayed final error too.
func IsFinal(err error) bool {
	var f *finalError
	return errors.As(err, &f)
}

// finalError keeps the message of the error it marks, so a final error reads
// the same whether it comes from the execution or from a replay.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// PanicError is the error every caller gets when fn panics. The key is
// released, as for any failure before commit, and the process goes on.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the panicking goroutine's stack, from runtime/debug.Stack
}

// Error reports the panic value. The stack stays in the Stack field, so an
// error message shown to a client never carries it.
func (e *PanicError) Error() string {
	return fmt.Sprintf("idem: fn panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, so that, for example,
// errors.Is(err, http.ErrAbortHandler) sees through the panic.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// NotRecordedError says why a final outcome (a success, or an error marked
// Final) was not recorded, though the store kept trying for
// Options.SettleTimeout and read the record back. It is never returned
// with the outcome: the operation took effect, so every caller is answered
// the outcome as if it were recorded, and a caller who checks err != nil
// cannot take a success for a failure and do the work again under a new
// key. The store logs it, and tells Observer.NotRecorded.
//
// The key stays claimed rather than released: for as long as the store
// lives, this process replays the outcome from memory, keeps the claim's
// lease renewed (so no other store takes the key for interrupted and runs
// it again) and goes on trying to record it (Forget and Resolve of the
// key in this store are refused with ErrKeyHeld meanwhile); after a
// restart the key is interrupted (ErrOutcomeUnknown) until an operator
// reconciles it. If instead the claim was lost (Err matches
// backend.ErrNotOwner: its lease lapsed, or an operator deleted it, and
// another owner may have taken the key), the backend holds what it holds
// now, which later callers get.
type NotRecordedError struct {
	Err error // why recording failed
}

func (e *NotRecordedError) Error() string {
	if errors.Is(e.Err, backend.ErrNotOwner) {
		return "idem: the operation finished but its outcome was not recorded: the claim was lost to another owner: " + e.Err.Error()
	}
	return "idem: the operation finished but its outcome was not recorded; the key stays claimed: " + e.Err.Error()
}

func (e *NotRecordedError) Unwrap() error { return e.Err }

// BackendError is returned when a Backend call fails: the backend is
// unreachable, full or broken, or gave an answer that breaks its
// contract. Op names the call ("claim", "get", "forget", "sweep",
// "resolve", "list"); for "claim", fn did not run, and a claim that may
// have landed unseen (its reply lost) is released as soon as the backend
// answers again.
type BackendError struct {
	Op  string
	Err error
}

func (e *BackendError) Error() string { return "idem: backend " + e.Op + ": " + e.Err.Error() }
func (e *BackendError) Unwrap() error { return e.Err }
