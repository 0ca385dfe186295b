// Package contain runs the user's code (a handler, a key or payload
// function, a reconcile hook) so that neither a panic nor runtime.Goexit
// escapes into the consumer: a broker's delivery goroutine that exited
// would leave its message unsettled and its consumer stalled.
package contain

import (
	"errors"
	"runtime/debug"

	"github.com/seed094d4201/idem"
)

// ErrExited is the error of a call that called runtime.Goexit.
var ErrExited = errors.New("idemqueue: the handler called runtime.Goexit")

// Call runs f on a goroutine of its own and returns its result, a
// *idem.PanicError if it panicked, or ErrExited (and zero values) if it
// called runtime.Goexit.
func Call[T any](f func() (T, error)) (v T, err error) {
	done := make(chan struct{})
	go func() {
		returned := false
		defer func() {
			if p := recover(); p != nil {
				err = &idem.PanicError{Value: p, Stack: debug.Stack()}
			} else if !returned {
				err = ErrExited
			}
			close(done)
		}()
		v, err = f()
		returned = true
	}()
	<-done
	return v, err
}
