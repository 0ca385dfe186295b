package idem

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// checkedError returns err, the error the work ended with, ready for the
// store to hand on. err is the user's code as much as fn is: the store
// calls its methods to classify it (Unwrap, Is and As, through IsFinal and
// errors.Is) and to record it (Error), on RunOnce's own goroutine too,
// where a panic crashed the process. They are tried once here, under
// guard, as the store will call them; if one panics, err is replaced by
// an error that cannot: a final error saying so, if err was marked Final
// (the mark is read without calling err's methods), else a *PanicError,
// a failure before commit, which releases the key, with the method's
// panic as its value. A nil pointer of an
// error type whose Error reads it (a typed nil marked Final) is the
// common case. A Goexit in a method ends the goroutine here, and its
// caller (Ticket.checked) settles the ticket as for a work that exited.
func checkedError(err error) (checked error) {
	if err == nil {
		return nil
	}
	returned := false
	defer guard(&returned, func(v any) { checked = brokenError(err, v) }, nil)
	_ = isFinalOutcome(err)
	_ = errors.Is(err, ErrPayloadMismatch) || errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrInProgress) || isBackendError(err)
	_ = err.Error()
	returned = true
	return err
}

// brokenError is what replaces err, whose methods panicked with v.
func brokenError(err error, v any) error {
	if f, ok := err.(*finalError); ok {
		return Final(fmt.Errorf("idem: a final error (%T) panicked when read: %v", f.err, v))
	}
	return &PanicError{Value: v, Stack: debug.Stack()} // the stack shows the method that panicked
}
