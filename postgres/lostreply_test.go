package postgres

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/internal/faultproxy"
	"github.com/seed094d4201/idem/internal/faulttest"
	"github.com/stretchr/testify/require"
)

// Replies lost, and connections killed, between the store and PostgreSQL.
func TestLostReplies(t *testing.T) {
	direct := testPool(t)
	faulttest.LostReplies(t, func(t *testing.T) faulttest.Target {
		b, table := testBackend(t, direct)
		cfg := direct.Config().Copy()
		proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		host, port, err := net.SplitHostPort(proxy.Addr())
		require.NoError(t, err)
		p, err := strconv.ParseUint(port, 10, 16)
		require.NoError(t, err)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		cfg.ConnConfig.Fallbacks = nil
		// Each statement goes whole, text and all, in one round trip, so
		// the proxy can tell them apart and a lost reply is the reply to an
		// executed, committed statement.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
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

// Stores whose clocks are a minute off either way, on one table.
func TestSkewedStores(t *testing.T) {
	pool := testPool(t)
	faulttest.SkewedStores(t, func(t *testing.T) idem.Backend {
		b, _ := testBackend(t, pool)
		return b
	})
}
