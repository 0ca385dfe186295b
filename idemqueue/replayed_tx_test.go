package idemqueue_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemqueue"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// A txBackend is a store on one of the backends with a RunOnceTx, and a
// call that runs fn through that RunOnceTx, its writes aside.
type txBackend struct {
	name  string
	store func(t *testing.T) *idem.Store[string]
	run   func(ctx context.Context, s *idem.Store[string], key string, payload any, fn func(context.Context) (string, error)) (string, error)
	newTx func(s *idem.Store[string]) error // idemqueue.NewTx with the backend's RunOnceTx
}

// testTable is a table name of the test's own.
func testTable() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idem_queue_test_" + hex.EncodeToString(b[:])
}

// newStore returns a store over b, closed when the test ends.
func newStore(t *testing.T, b idem.Options) *idem.Store[string] {
	s := idem.New[string](b)
	t.Cleanup(func() { s.Close() })
	return s
}

var txBackends = []txBackend{
	{
		name: "bolt",
		store: func(t *testing.T) *idem.Store[string] {
			b, err := bolt.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
			require.NoError(t, err)
			t.Cleanup(func() { b.Close() })
			return newStore(t, idem.Options{Backend: b})
		},
		run: func(ctx context.Context, s *idem.Store[string], key string, payload any, fn func(context.Context) (string, error)) (string, error) {
			return bolt.RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ *bbolt.Tx) (string, error) { return fn(ctx) })
		},
		newTx: func(s *idem.Store[string]) error {
			_, err := idemqueue.NewTx(s, bolt.RunOnceTx[string], idemqueue.Options{})
			return err
		},
	},
	{
		name: "sqlite",
		store: func(t *testing.T) *idem.Store[string] {
			db, err := sqlite.Open(filepath.Join(t.TempDir(), "keys.db"))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			b, err := sqlite.New(context.Background(), db, sqlite.Options{})
			require.NoError(t, err)
			return newStore(t, idem.Options{Backend: b})
		},
		run: func(ctx context.Context, s *idem.Store[string], key string, payload any, fn func(context.Context) (string, error)) (string, error) {
			return sqlite.RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ *sql.Tx) (string, error) { return fn(ctx) })
		},
		newTx: func(s *idem.Store[string]) error {
			_, err := idemqueue.NewTx(s, sqlite.RunOnceTx[string], idemqueue.Options{})
			return err
		},
	},
	{
		name: "postgres",
		store: func(t *testing.T) *idem.Store[string] {
			pool, err := pgxpool.New(context.Background(), svctest.Postgres(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			table := testTable()
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
			b, err := postgres.New(context.Background(), pool, postgres.Options{Table: table})
			require.NoError(t, err)
			return newStore(t, idem.Options{Backend: b})
		},
		run: func(ctx context.Context, s *idem.Store[string], key string, payload any, fn func(context.Context) (string, error)) (string, error) {
			return postgres.RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ pgx.Tx) (string, error) { return fn(ctx) })
		},
		newTx: func(s *idem.Store[string]) error {
			_, err := idemqueue.NewTx(s, postgres.RunOnceTx[string], idemqueue.Options{})
			return err
		},
	},
	{
		name: "mysql",
		store: func(t *testing.T) *idem.Store[string] {
			db, err := sql.Open("mysql", svctest.MySQL(t))
			require.NoError(t, err)
			t.Cleanup(func() { db.Close() })
			table := testTable()
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
			b, err := mysql.New(context.Background(), db, mysql.Options{Table: table})
			require.NoError(t, err)
			return newStore(t, idem.Options{Backend: b})
		},
		run: func(ctx context.Context, s *idem.Store[string], key string, payload any, fn func(context.Context) (string, error)) (string, error) {
			return mysql.RunOnceTx(ctx, s, key, payload, func(ctx context.Context, _ *sql.Tx) (string, error) { return fn(ctx) })
		},
		newTx: func(s *idem.Store[string]) error {
			_, err := idemqueue.NewTx(s, mysql.RunOnceTx[string], idemqueue.Options{})
			return err
		},
	},
}

// A redelivery that HandleTx answers from the outcome its first delivery
// recorded is told apart, as the package doc's table says: "Ack,
// replayed", or "Reject, replayed" for a final error; the first delivery
// is not. Duplicate metrics read it. On every backend with a RunOnceTx.
func TestHandleTxReportsReplays(t *testing.T) {
	for _, be := range txBackends {
		t.Run(be.name, func(t *testing.T) {
			ctx := context.Background()
			s := be.store(t)
			q, err := idemqueue.New(s, idemqueue.Options{})
			require.NoError(t, err)
			ran := 0
			deliver := func(q *idemqueue.Consumer[string], key string, fnErr error) idemqueue.Decision {
				return q.HandleTx(ctx, key, []byte("body"), func(ctx context.Context, key string, payload any) error {
					_, err := be.run(ctx, q.Store(), key, payload, func(context.Context) (string, error) {
						ran++
						return "done", fnErr
					})
					return err
				})
			}

			d := deliver(q, "msg-1", nil)
			assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack}, d, "the first delivery ran")
			d = deliver(q, "msg-1", nil)
			assert.Equal(t, idemqueue.Decision{Action: idemqueue.Ack, Replayed: true}, d, "a redelivery")
			assert.Equal(t, 1, ran)

			declined := idem.Final(errors.New("card declined"))
			d = deliver(q, "msg-2", declined)
			assert.Equal(t, idemqueue.Reject, d.Action)
			assert.False(t, d.Replayed, "the first delivery ran")
			d = deliver(q, "msg-2", declined)
			assert.Equal(t, idemqueue.Reject, d.Action)
			assert.True(t, d.Replayed, "a redelivery of a final failure")
			assert.Equal(t, 2, ran)

			d = deliver(q, "msg-3", errors.New("bank down"))
			assert.Equal(t, idemqueue.Retry, d.Action)
			assert.False(t, d.Replayed, "a failure is not recorded, so never replayed")
			assert.Equal(t, 3, ran)
		})
	}
}

// NewTx takes a store with the backend of its RunOnceTx, on every
// backend that has one.
func TestNewTxTakesEveryBackend(t *testing.T) {
	for _, be := range txBackends {
		t.Run(be.name, func(t *testing.T) {
			assert.NoError(t, be.newTx(be.store(t)))
		})
	}
}
