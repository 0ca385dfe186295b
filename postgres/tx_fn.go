package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// savepoint is the name of the savepoint RunOnceTx's fn runs in: one that
// fn cannot guess, so its own savepoints (pgx names them sp_1, sp_2...)
// never shadow or release it. One name for the process, so that the
// statements that name it are prepared once per connection.
var savepoint = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem_fn_" + hex.EncodeToString(b[:])
}()

// fnTx is the transaction RunOnceTx hands its fn: the savepoint taken
// after the claim, which fn sees as a nested transaction, as pgx's
// tx.Begin gives one. Its Commit releases the savepoint and its Rollback
// rolls back to it, as pgx's nested transactions do, after which every
// statement through it fails with pgx.ErrTxClosed; RunOnceTx then fails,
// committing nothing. The transaction around it (the claim's) is
// RunOnceTx's own: it is begun, and committed with the outcome, in the
// same round trips as the claim and the outcome, which pgx's own
// transaction would each send on their own.
//
// The embedded Tx, begun with the savepoint as its BEGIN, is pgx's: it
// runs fn's statements and nested transactions and gives its large
// objects. It is never committed nor rolled back itself (its COMMIT would
// end the claim's transaction, not the savepoint).
type fnTx struct {
	pgx.Tx
	closed bool
}

// ended reports whether fn may no longer send statements through t: it
// committed or rolled back the savepoint, or it ended the claim's
// transaction itself with a COMMIT or ROLLBACK statement. After such a
// statement the connection is idle, outside any transaction, and each
// later statement would commit on its own, outside any key, for every
// retry to write again; its status, kept from the server's last reply,
// says so without a round trip.
func (t *fnTx) ended() bool {
	return t.closed || t.Tx.Conn().PgConn().TxStatus() == 'I'
}

func (t *fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Begin(ctx)
}

func (t *fnTx) Commit(ctx context.Context) error {
	if t.ended() {
		return pgx.ErrTxClosed
	}
	_, err := t.Tx.Exec(ctx, `release savepoint `+savepoint)
	t.closed = true
	return err
}

func (t *fnTx) Rollback(ctx context.Context) error {
	if t.ended() {
		return pgx.ErrTxClosed
	}
	_, err := t.Tx.Exec(ctx, `rollback to savepoint `+savepoint)
	t.closed = true
	return err
}

func (t *fnTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *fnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.ended() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *fnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended() {
		// As pgx does: the error also comes from the rows, for a caller
		// that checks it there.
		return closedRows{}, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *fnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended() {
		return closedRows{}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *fnTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended() {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *fnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended() {
		return closedBatch{}
	}
	return t.Tx.SendBatch(ctx, b)
}

// closedRows is the answer of a closed fnTx to a query, a row or a batch:
// pgx.ErrTxClosed from each.
type closedRows struct{}

func (closedRows) Close()                                       {}
func (closedRows) Err() error                                   { return pgx.ErrTxClosed }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (closedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (closedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }

type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return closedRows{}, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRows{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
