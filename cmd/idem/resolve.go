package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A resolution is the outcome an operator gives an interrupted key.
type resolution struct {
	result []byte        // the result, in the store's JSON encoding; nil with errMsg
	errMsg string        // a final error's message
	ttl    time.Duration // how long the outcome is replayed
	force  bool          // write result even if its shape is not the store's
}

// newResolution checks resolve's flags: exactly one of -result and -error.
func newResolution(result, errMsg string, ttl time.Duration) (*resolution, error) {
	switch {
	case (result == "") == (errMsg == ""):
		return nil, errors.New("give the outcome: either -result JSON or -error MSG")
	case ttl <= 0:
		return nil, errors.New("-ttl must be positive")
	case result != "" && !json.Valid([]byte(result)):
		return nil, fmt.Errorf("-result is not valid JSON: %s", result)
	}
	r := &resolution{errMsg: errMsg, ttl: ttl}
	if result != "" {
		r.result = []byte(result)
	}
	return r, nil
}

// resolve settles key, which must be interrupted, with the outcome r: the
// operator has checked that its operation took effect. Like
// idem.Store.Resolve, it is fenced by the interrupted claim's token.
func (t *tool) resolve(ctx context.Context, key string, r *resolution) error {
	rec, err := t.get(ctx, key)
	switch {
	case err != nil:
		return err
	case rec.State == backend.StateCompleted:
		return fmt.Errorf("key %q already has an outcome; nothing to resolve (see it with: %s)", key, t.next("show", key))
	case rec.State != backend.StateInterrupted:
		// Only the backend's own judgement counts: a shared backend's
		// clock decides whether the lease lapsed, not this host's.
		return t.inFlight(ctx, rec)
	}
	if r.result != nil && !r.force {
		if err := t.checkShape(ctx, r.result); err != nil {
			return err
		}
	}
	done := rec
	done.State, done.Value, done.Failed, done.ErrMsg = backend.StateCompleted, r.result, r.errMsg != "", r.errMsg
	if done.Value == nil {
		done.Value = []byte("null")
	}
	if err := t.b.Complete(ctx, done, t.now, r.ttl); err != nil {
		if errors.Is(err, backend.ErrNotOwner) {
			return fmt.Errorf("key %q changed hands while it was resolved; look again with: %s", key, t.next("show", key))
		}
		return err
	}
	fmt.Fprintf(t.w, "resolved %q: later calls with this key replay this outcome for %s\n", key, r.ttl)
	return nil
}
