package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/seed094d4201/idem/backend"
)

var _ backend.Stepper = (*Backend)(nil)

// RecordStep records step under key's claim held by token, its At the
// server's now; now is ignored. The steps are one encoded value, so it
// reads them under a row lock and writes them back in one transaction.
func (b *Backend) RecordStep(ctx context.Context, key, token string, step backend.Step, _ time.Time) error {
	if err := b.nested(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return backend.Refuse(err) // nothing sent: nothing to read back
	}
	// Read committed, whatever the server's default: a row that another
	// transaction changed while this one waited for its lock is judged
	// anew, not failed as a serialization conflict.
	return pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var data []byte
		err := tx.QueryRow(ctx, b.q.lockSteps, key, token).Scan(&data, &step.At)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: key %q has no pending claim of this token whose lease holds", backend.ErrNotOwner, key)
		}
		if err != nil {
			return err
		}
		steps, err := backend.ReadSteps(data)
		if err != nil {
			return fmt.Errorf("postgres: key %q: %w", key, err)
		}
		rec := backend.Record{Steps: steps}.WithStep(step)
		tag, err := tx.Exec(ctx, b.q.setSteps, key, token, backend.AppendSteps(nil, rec.Steps))
		return backend.Owned(tag.RowsAffected(), err, key)
	})
}

// Resume takes over key's interrupted record held by old, judging its lease
// by the server's clock and giving it a lease after the server's now; now
// is ignored.
func (b *Backend) Resume(ctx context.Context, key, old, token string, _ time.Time, lease time.Duration) (backend.Record, error) {
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, err
	}
	rec, found, err := b.queryOne(ctx, b.q.resume, []any{key, old, token, micros(lease)})
	if err == nil && !found {
		err = fmt.Errorf("%w: key %q is not interrupted under this token", backend.ErrNotOwner, key)
	}
	return rec, err
}
