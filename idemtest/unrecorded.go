package idemtest

import (
	"context"
	"errors"
	"sync"

	"github.com/seed094d4201/idem"
)

// Unrecorded collects what a Store's Observer is told of the final
// outcomes its Backend could not record: a test's way to see what a
// caller is not shown (it is answered the outcome). Set Options.Observer
// to its Observer. It is safe for concurrent use; the zero value is ready.
type Unrecorded struct {
	mu   sync.Mutex
	errs map[string][]*idem.NotRecordedError // guarded by mu; by key, in order
}

// Observer returns an Observer whose NotRecorded collects into u.
func (u *Unrecorded) Observer() *idem.Observer {
	return &idem.Observer{NotRecorded: func(_ context.Context, key string, err error) {
		var nr *idem.NotRecordedError
		if !errors.As(err, &nr) {
			nr = &idem.NotRecordedError{Err: err}
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.errs == nil {
			u.errs = map[string][]*idem.NotRecordedError{}
		}
		u.errs[key] = append(u.errs[key], nr)
	}}
}

// Of returns the last outcome of key that was not recorded, or nil.
func (u *Unrecorded) Of(key string) *idem.NotRecordedError {
	u.mu.Lock()
	defer u.mu.Unlock()
	if errs := u.errs[key]; len(errs) > 0 {
		return errs[len(errs)-1]
	}
	return nil
}

// Count returns how many outcomes of key were not recorded.
func (u *Unrecorded) Count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.errs[key])
}
