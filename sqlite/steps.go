package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/seed094d4201/idem/backend"
)

var _ backend.Stepper = (*Backend)(nil)

// RecordStep records step under key's claim held by token, in one
// transaction: read the record, add the step, write the steps back under
// the same token compare.
func (b *Backend) RecordStep(ctx context.Context, key, token string, step backend.Step, now time.Time) error {
	step.At = now
	var owned error
	err := b.do(ctx, func(ctx context.Context, tx *sql.Tx) error {
		rec, found, err := scanOne(b.query(ctx, tx, b.q.get, key))
		switch {
		case err != nil:
			return err
		case !found || !rec.HeldBy(token, now):
			owned = fmt.Errorf("%w: key %q", backend.ErrNotOwner, key)
			return nil
		}
		owned = nil
		steps := backend.AppendSteps(nil, rec.WithStep(step).Steps)
		_, err = b.execIn(ctx, tx, b.q.setSteps, key, token, steps, now.UnixNano())
		return err
	})
	if err != nil {
		return err
	}
	return owned
}

// Resume takes over key's interrupted record held by old.
func (b *Backend) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	var rec backend.Record
	var owned error
	err := b.do(ctx, func(ctx context.Context, tx *sql.Tx) error {
		cur, found, err := scanOne(b.query(ctx, tx, b.q.get, key))
		switch {
		case err != nil:
			return err
		case !found || !cur.Resumable(old, now):
			owned = fmt.Errorf("%w: key %q", backend.ErrNotOwner, key)
			return nil
		}
		var until any
		if lease > 0 {
			until = now.Add(lease).UnixNano()
		}
		// Under the write lock, after the read: the row is the one read.
		rec, found, err = scanOne(b.query(ctx, tx, b.q.resume, key, old, token, until))
		owned = nil
		if err == nil && !found {
			owned = fmt.Errorf("%w: key %q", backend.ErrNotOwner, key)
		}
		return err
	})
	if err != nil {
		return backend.Record{}, err
	}
	return rec, owned
}
