package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

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
	_, err := retried(ctx, func() (struct{}, error) { return struct{}{}, b.recordStep(ctx, key, token, step) })
	return err
}

func (b *Backend) recordStep(ctx context.Context, key, token string, step backend.Step) error {
	// Read committed, whatever the session's level: the locking read sees
	// the row as it stands, and locks it alone.
	tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op once committed
	var data []byte
	var at int64
	err = tx.QueryRowContext(ctx, b.q.lockSteps, []byte(key), []byte(token)).Scan(&data, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: key %q has no pending claim of this token whose lease holds", backend.ErrNotOwner, key)
	}
	if err != nil {
		return err
	}
	steps, err := backend.ReadSteps(data)
	if err != nil {
		return fmt.Errorf("mysql: key %q: %w", key, err)
	}
	step.At = time.UnixMicro(at)
	rec := backend.Record{Steps: steps}.WithStep(step)
	encoded := backend.AppendSteps(nil, rec.Steps)
	if err := b.fits(key, len(encoded)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, b.q.setSteps, encoded, []byte(key), []byte(token)); err != nil {
		return b.oversized(err, len(encoded))
	}
	return tx.Commit()
}

// Resume takes over key's interrupted record held by old, judging its lease
// by the server's clock and giving it a lease after the server's now; now
// is ignored.
func (b *Backend) Resume(ctx context.Context, key, old, token string, _ time.Time, lease time.Duration) (backend.Record, error) {
	if err := b.nested(ctx); err != nil {
		return backend.Record{}, err
	}
	n, err := b.exec(ctx, b.q.resume, []byte(token), micros(lease), []byte(key), []byte(old))
	if err != nil {
		return backend.Record{}, err
	}
	if n == 0 {
		return backend.Record{}, fmt.Errorf("%w: key %q is not interrupted under this token", backend.ErrNotOwner, key)
	}
	f, err := retried(ctx, func() (found, error) { return queryOne(ctx, b.pooled(), b.q.get, []any{[]byte(key)}) })
	switch {
	case err != nil:
		return backend.Record{}, err
	case !f.ok || f.rec.Token != token:
		// Gone between the two statements (an operator's Forget), or
		// taken as interrupted again under a lease that lapsed at once.
		return backend.Record{}, fmt.Errorf("%w: key %q changed hands as it was resumed", backend.ErrNotOwner, key)
	}
	return f.rec, nil
}
