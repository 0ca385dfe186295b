package bolt

import (
	"context"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
	bbolt "go.etcd.io/bbolt"
)

var _ backend.Stepper = (*Backend)(nil)

// RecordStep records step under key's claim held by token, in a shared,
// durable commit.
func (b *Backend) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) error {
	k := []byte(key)
	step.At = now
	return b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		claim, err := checkLiveOwner(records, k, token, now)
		if err != nil {
			return err
		}
		return put(records, claim.WithStep(step))
	})
}

// Resume takes over key's interrupted record held by old.
func (b *Backend) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	k := []byte(key)
	var rec backend.Record
	err := b.write(ctx, func(tx *bbolt.Tx) error {
		records := b.bucket(tx, bucketRecords)
		v, err := records.Get(k)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: key %q has no record", backend.ErrNotOwner, key)
		}
		cur, err := decode(k, v)
		if err != nil {
			return err
		}
		if !cur.Resumable(old, now) {
			return fmt.Errorf("%w: key %q is %s under another claim, or its lease holds", backend.ErrNotOwner, key, cur.State)
		}
		cur.Token, cur.State, cur.LeaseUntil = token, backend.StatePending, time.Time{}
		if lease > 0 {
			cur.LeaseUntil = now.Add(lease)
		}
		if err := put(records, cur); err != nil {
			return err
		}
		rec = cur
		// Pending again: if this process dies too, the next Open marks it
		// interrupted.
		return b.bucket(tx, bucketPending).Put(pendingKey(cur), nil)
	})
	return rec, err
}

// withoutValues returns steps with their names and times only.
func withoutValues(steps []backend.Step) []backend.Step {
	out := make([]backend.Step, len(steps))
	for i, s := range steps {
		out[i] = backend.Step{Name: s.Name, At: s.At, Failed: s.Failed}
	}
	return out
}
