package postgres

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Replies lost, and connections killed, between the store and PostgreSQL.
func TestLostReplies(t *testing.T) {
	direct := plainPool(t)
	faulttest.LostReplies(t, func(t *testing.T) faulttest.Target {
		b, table := testBackend(t, direct)
		pool, proxy := proxiedPool(t, direct)
		through, err := New(context.Background(), pool, Options{Table: table, NoMigrate: true})
		require.NoError(t, err)
		return faulttest.Target{
			Proxy: proxy, Backend: through, Direct: b,
			Claim:    []byte("INSERT INTO"),
			Complete: []byte("SET state = 2"),
			Release:  []byte("DELETE FROM " + pgx.Identifier{table}.Sanitize() + " WHERE key = $1 AND token = $2"),
			Done:     faultproxy.PostgresReadyForQuery,
		}
	})
}

// The reply to RunOnceTx's COMMIT is lost after the commit took effect: the
// caller is told the outcome, not an error, and a retry replays it.
func TestRunOnceTxLostCommitReply(t *testing.T) {
	direct := plainPool(t)
	_, table := testBackend(t, direct)
	pool, proxy := proxiedPool(t, direct)
	b, err := New(context.Background(), pool, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	var calls atomic.Int32
	fn := func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls.Add(1)
		proxy.DropReply([]byte("commit"), faultproxy.PostgresReadyForQuery)
		return 42, nil
	}
	v, err := RunOnceTx(context.Background(), s, "k", "p", fn)
	select {
	case <-proxy.Fired():
	default:
		t.Fatal("the COMMIT reply was not dropped: the test proved nothing")
	}
	require.NoError(t, err, "the transaction committed: its outcome is not an error")
	assert.Equal(t, 42, v)
	v, err = RunOnceTx(context.Background(), s, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, 42, v)
	assert.Equal(t, int32(1), calls.Load())
}

// plainPool is testPool for the tests that drop replies with a fault
// proxy: the proxy finds the statement whose reply it drops by its SQL, so
// the connection must not be encrypted. With TLS it would drop nothing and
// the test would prove nothing; so it skips, as without a DSN.
func plainPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testPool(t)
	if pool.Config().ConnConfig.TLSConfig != nil {
		svctest.Skipf(t, "IDEM_POSTGRES_DSN must use sslmode=disable (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) so the fault proxy can read the SQL")
	}
	return pool
}

// proxiedPool is a pool like direct's whose connections go through a fault
// proxy. Each statement goes whole, text and all, in one round trip, so the
// proxy can tell them apart and a lost reply is the reply to an executed,
// committed statement.
func proxiedPool(t *testing.T, direct *pgxpool.Pool) (*pgxpool.Pool, *faultproxy.Proxy) {
	cfg := direct.Config().Copy()
	proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, proxy
}

// Stores whose clocks are a minute off either way, on one table.
func TestSkewedStores(t *testing.T) {
	pool := testPool(t)
	faulttest.SkewedStores(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, pool)
		return b
	})
}
