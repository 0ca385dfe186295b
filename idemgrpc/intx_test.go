package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A txDB is a store on one of the backends with an InTx, and the charges
// table a handler writes through the call's transaction.
type txDB struct {
	store  *idem.Store[idemgrpc.Reply]
	inTx   func(ctx context.Context, store *idem.Store[idemgrpc.Reply], key string, payload any, fn func(ctx context.Context) (idemgrpc.Reply, error)) (idemgrpc.Reply, error)
	insert func(ctx context.Context, order string) error // through the transaction in ctx
	rows   func(t *testing.T, order string) int          // committed charges for order
}

// txTable is a table name of the test's own.
func txTable(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

var txDBs = []struct {
	name string
	open func(t *testing.T) txDB
}{
	{"sqlite", func(t *testing.T) txDB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "charges.db"))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		b, err := sqlite.New(context.Background(), db, sqlite.Options{})
		require.NoError(t, err)
		_, err = db.Exec(`CREATE TABLE charges (order_id TEXT NOT NULL)`)
		require.NoError(t, err)
		return txDB{
			store: newStore(t, idem.Options{Backend: b}),
			inTx:  sqlite.InTx[idemgrpc.Reply],
			insert: func(ctx context.Context, order string) error {
				tx, ok := sqlite.TxFromContext(ctx)
				if !ok {
					return status.Error(codes.FailedPrecondition, "no transaction in the handler's ctx")
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id) VALUES (?)`, order)
				return err
			},
			rows: func(t *testing.T, order string) (n int) {
				require.NoError(t, db.QueryRow(`SELECT count(*) FROM charges WHERE order_id = ?`, order).Scan(&n))
				return n
			},
		}
	}},
	{"postgres", func(t *testing.T) txDB {
		pool, err := pgxpool.New(context.Background(), svctest.Postgres(t))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		keys, charges := txTable("idem_grpc_keys_"), txTable("idem_grpc_charges_")
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+keys+", "+charges) })
		b, err := postgres.New(context.Background(), pool, postgres.Options{Table: keys})
		require.NoError(t, err)
		_, err = pool.Exec(context.Background(), "CREATE TABLE "+charges+" (order_id TEXT NOT NULL)")
		require.NoError(t, err)
		return txDB{
			store: newStore(t, idem.Options{Backend: b}),
			inTx:  postgres.InTx[idemgrpc.Reply],
			insert: func(ctx context.Context, order string) error {
				tx, ok := postgres.TxFromContext(ctx)
				if !ok {
					return status.Error(codes.FailedPrecondition, "no transaction in the handler's ctx")
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+charges+" (order_id) VALUES ($1)", order)
				return err
			},
			rows: func(t *testing.T, order string) (n int) {
				require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+charges+" WHERE order_id = $1", order).Scan(&n))
				return n
			},
		}
	}},
	{"mysql", func(t *testing.T) txDB {
		db, err := sql.Open("mysql", svctest.MySQL(t))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		keys, charges := txTable("idem_grpc_keys_"), txTable("idem_grpc_charges_")
		t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + keys + ", " + charges) })
		b, err := mysql.New(context.Background(), db, mysql.Options{Table: keys})
		require.NoError(t, err)
		_, err = db.Exec("CREATE TABLE " + charges + " (order_id VARCHAR(64) NOT NULL) ENGINE=InnoDB")
		require.NoError(t, err)
		return txDB{
			store: newStore(t, idem.Options{Backend: b}),
			inTx:  mysql.InTx[idemgrpc.Reply],
			insert: func(ctx context.Context, order string) error {
				tx, ok := mysql.TxFromContext(ctx)
				if !ok {
					return status.Error(codes.FailedPrecondition, "no transaction in the handler's ctx")
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO "+charges+" (order_id) VALUES (?)", order)
				return err
			},
			rows: func(t *testing.T, order string) (n int) {
				require.NoError(t, db.QueryRow("SELECT count(*) FROM "+charges+" WHERE order_id = ?", order).Scan(&n))
				return n
			},
		}
	}},
}

// eachTxDB runs test on every backend with an InTx; those whose service is
// not there are skipped as svctest says.
func eachTxDB(t *testing.T, test func(t *testing.T, db txDB)) {
	for _, b := range txDBs {
		t.Run(b.name, func(t *testing.T) { test(t, b.open(t)) })
	}
}

// txCharges is a Charge handler that inserts its order's charge through
// the call's transaction, sets a header and a trailer, and answers the
// run's number; then, if set, it calls after, whose error (or panic) is
// the run's.
type txCharges struct {
	db      txDB
	runs    atomic.Int32
	entered chan struct{} // if set, told when a run has inserted its row
	gate    chan struct{} // if set, each run waits for it after inserting
	after   func(ctx context.Context, n int32) error
}

func (c *txCharges) charge(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	n := c.runs.Add(1)
	order := in.Fields["order"].GetStringValue()
	if err := c.db.insert(ctx, order); err != nil {
		return nil, err
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("charge-id", "ch_"+order))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("ledger", "posted"))
	if c.entered != nil {
		c.entered <- struct{}{}
	}
	if c.gate != nil {
		<-c.gate
	}
	if c.after != nil {
		if err := c.after(ctx, n); err != nil {
			return nil, err
		}
	}
	return structpb.NewStruct(map[string]any{"order": order, "run": float64(n)})
}

var txServiceDesc = grpc.ServiceDesc{
	ServiceName: "idem.test.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				return srv.(*txCharges).charge(ctx, req.(*structpb.Struct))
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: chargeMethod}, handler)
		},
	}},
}

// startTx serves c over an in-memory connection, guarded in the
// transactional mode with opts.
func startTx(t *testing.T, c *txCharges, opts idemgrpc.Options) *grpc.ClientConn {
	opts.Unscoped, opts.InTx = true, c.db.inTx
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(c.db.store, opts)))
	srv.RegisterService(&txServiceDesc, c)
	conn := startService(t, srv)
	return conn
}

// callTx charges order under key, and returns the response with the
// headers and trailers the client got.
func callTx(ctx context.Context, conn *grpc.ClientConn, key, order string) (out *structpb.Struct, header, trailer metadata.MD, err error) {
	in, _ := structpb.NewStruct(map[string]any{"order": order})
	out = new(structpb.Struct)
	err = conn.Invoke(idemgrpc.WithKey(ctx, key), chargeMethod, in, out, grpc.Header(&header), grpc.Trailer(&trailer))
	return out, header, trailer, err
}

func TestInTxCommitsTheHandlersRowWithItsReplyAndReplaysIt(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db}
		conn := startTx(t, c, idemgrpc.Options{})
		first, h1, t1, err := callTx(context.Background(), conn, "k1", "o1")
		require.NoError(t, err)
		assert.Empty(t, h1.Get(idemgrpc.ReplayedHeader))
		assert.Equal(t, []string{"ch_o1"}, h1.Get("charge-id"))
		assert.Equal(t, []string{"posted"}, t1.Get("ledger"))
		assert.Equal(t, 1, db.rows(t, "o1"))
		for range 2 {
			again, h, tr, err := callTx(context.Background(), conn, "k1", "o1")
			require.NoError(t, err)
			assert.True(t, proto.Equal(first, again), "a replay answers the first response: %v, then %v", first, again)
			assert.Equal(t, []string{"true"}, h.Get(idemgrpc.ReplayedHeader))
			assert.Equal(t, h1.Get("charge-id"), h.Get("charge-id"))
			assert.Equal(t, t1.Get("ledger"), tr.Get("ledger"))
		}
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"))
	})
}

func TestInTxHandlerErrorRollsBackItsRowAndFreesTheKey(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db, after: func(_ context.Context, n int32) error {
			if n == 1 {
				return status.Error(codes.Unavailable, "the ledger is busy")
			}
			return nil
		}}
		conn := startTx(t, c, idemgrpc.Options{})
		_, h, _, err := callTx(context.Background(), conn, "k1", "o1")
		require.Equal(t, codes.Unavailable, code(err), "%v", err)
		assert.Equal(t, "the ledger is busy", status.Convert(err).Message(), "the handler's own error")
		assert.Equal(t, []string{"ch_o1"}, h.Get("charge-id"), "an error delivered as the handler returned it carries its headers")
		assert.Equal(t, 0, db.rows(t, "o1"), "the error rolled the row back")

		out, h, _, err := callTx(context.Background(), conn, "k1", "o1")
		require.NoError(t, err)
		assert.Empty(t, h.Get(idemgrpc.ReplayedHeader), "the retry ran the handler afresh")
		assert.Equal(t, float64(2), out.Fields["run"].GetNumberValue())
		assert.Equal(t, 1, db.rows(t, "o1"))
	})
}

// A final error is the call's answer, as a 4xx is an HTTP handler's: it
// commits with what the handler wrote.
func TestInTxFinalErrorCommitsWithTheHandlersRow(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db, after: func(context.Context, int32) error {
			return idem.Final(status.Error(codes.FailedPrecondition, "card declined"))
		}}
		conn := startTx(t, c, idemgrpc.Options{})
		for i := range 2 {
			_, h, _, err := callTx(context.Background(), conn, "k1", "o1")
			require.Equal(t, codes.FailedPrecondition, code(err), "%v", err)
			assert.Equal(t, "card declined", status.Convert(err).Message())
			assert.Equal(t, i == 1, h.Get(idemgrpc.ReplayedHeader) != nil, "call %d", i)
		}
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"), "a final error commits with the handler's writes")
	})
}

func TestInTxPanicRollsBackSendsNothingOfItAndFreesTheKey(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db, after: func(ctx context.Context, n int32) error {
			if n == 1 {
				_ = grpc.SendHeader(ctx, metadata.Pairs("sent-early", "yes"))
				panic("ledger exploded")
			}
			return nil
		}}
		conn := startTx(t, c, idemgrpc.Options{Logger: quietLogger()})
		_, h, tr, err := callTx(context.Background(), conn, "k1", "o1")
		require.Equal(t, codes.Internal, code(err), "%v", err)
		assert.Empty(t, h.Get("charge-id"), "nothing the panicked handler set reaches the client")
		assert.Empty(t, h.Get("sent-early"), "a held SendHeader of a panicked handler is never sent")
		assert.Empty(t, tr.Get("ledger"))
		assert.Equal(t, 0, db.rows(t, "o1"))

		_, h, _, err = callTx(context.Background(), conn, "k1", "o1")
		require.NoError(t, err)
		assert.Empty(t, h.Get(idemgrpc.ReplayedHeader))
		assert.Equal(t, int32(2), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"))
	})
}

func TestInTxDuplicateWaitsForTheTransactionThenReplays(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db, entered: make(chan struct{}, 1), gate: make(chan struct{})}
		conn := startTx(t, c, idemgrpc.Options{Wait: time.Minute})
		type answer struct {
			out *structpb.Struct
			h   metadata.MD
			err error
		}
		answers := make(chan answer, 3)
		call := func() {
			out, h, _, err := callTx(context.Background(), conn, "k1", "o1")
			answers <- answer{out, h, err}
		}
		go call()
		<-c.entered // the first run holds its transaction open
		go call()
		go call()
		close(c.gate) // the duplicates wait on the claim or are still arriving: either way they replay
		var own, replays int
		for range 3 {
			a := <-answers
			require.NoError(t, a.err)
			assert.Equal(t, float64(1), a.out.Fields["run"].GetNumberValue(), "every call gets the one run's response")
			if a.h.Get(idemgrpc.ReplayedHeader) != nil {
				replays++
			} else {
				own++
			}
		}
		assert.Equal(t, 1, own)
		assert.Equal(t, 2, replays)
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"))
	})
}

// A duplicate's wait ends at Options.Wait, and a caller that goes away
// ends only its own wait: neither cuts the run in flight, which commits,
// and whose reply the next retry gets.
func TestInTxWaitEndsButTheRunInFlightCommits(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db, entered: make(chan struct{}, 1), gate: make(chan struct{})}
		// Two servers on one store: the first call and the retry wait
		// long, so that a loaded machine never ends their wait before
		// the run; the duplicate's wait is too short to outlast it.
		conn := startTx(t, c, idemgrpc.Options{Wait: time.Minute})
		hasty := startTx(t, c, idemgrpc.Options{Wait: 20 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, _, _, err := callTx(ctx, conn, "k1", "o1")
			first <- err
		}()
		<-c.entered
		_, _, _, err := callTx(context.Background(), hasty, "k1", "o1")
		assert.Equal(t, codes.Aborted, code(err), "a duplicate whose wait ran out: %v", err)
		cancel()
		assert.Equal(t, codes.Canceled, code(<-first))
		close(c.gate)

		// The retry may come before the run has committed: it waits.
		out, h, _, err := callTx(context.Background(), conn, "k1", "o1")
		require.NoError(t, err)
		assert.Equal(t, []string{"true"}, h.Get(idemgrpc.ReplayedHeader))
		assert.Equal(t, float64(1), out.Fields["run"].GetNumberValue())
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"))
	})
}

func TestInTxDifferentPayloadIsRefused(t *testing.T) {
	eachTxDB(t, func(t *testing.T, db txDB) {
		c := &txCharges{db: db}
		conn := startTx(t, c, idemgrpc.Options{})
		_, _, _, err := callTx(context.Background(), conn, "k1", "o1")
		require.NoError(t, err)
		_, _, _, err = callTx(context.Background(), conn, "k1", "o2")
		assert.Equal(t, codes.InvalidArgument, code(err), "%v", err)
		assert.Equal(t, int32(1), c.runs.Load())
		assert.Equal(t, 1, db.rows(t, "o1"))
		assert.Equal(t, 0, db.rows(t, "o2"))
	})
}

// startService serves srv over an in-memory connection and returns a
// client connection to it.
func startService(t *testing.T, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// quietLogger drops what the interceptor logs, for a test that panics on
// purpose.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
