package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// modePool returns a pool whose statements run in mode: the simple
// protocol and QueryExecModeExec read text columns, which rows.Scan
// decodes; the default reads binary ones, which decodeRow does.
func modePool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	testPool(t) // skips, or fails in CI, without a database
	cfg, err := pgxpool.ParseConfig(svctest.Postgres(t))
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// The conformance suite on a pool that reads text columns: the path that
// decodeRow hands to rows.Scan keeps the contract too.
func TestConformanceSimpleProtocol(t *testing.T) {
	pool := modePool(t, pgx.QueryExecModeSimpleProtocol)
	idemtest.RunShared(t, func(t *testing.T) backend.Backend {
		b, _ := testBackend(t, pool)
		return b
	})
}

// Every record shape read by decodeRow (binary columns) is the record
// rows.Scan reads (text columns) from the same row: pending with and
// without a lease, interrupted, completed with a value, an empty value, a
// final error, steps; through Get, Claim's answer and Each.
func TestDecodeRowReadsWhatScanReads(t *testing.T) {
	binary := modePool(t, pgx.QueryExecModeCacheStatement)
	text := modePool(t, pgx.QueryExecModeSimpleProtocol)
	bb, table := testBackend(t, binary)
	tb, err := New(context.Background(), text, Options{Table: table, NoMigrate: true})
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now()
	fp := [32]byte{1, 2, 3, 0xff}
	claim := func(key string, lease time.Duration) backend.Record {
		rec, won, err := bb.Claim(ctx, backend.Record{Key: key, Token: "tok-" + key, Fingerprint: fp}, now, lease)
		require.NoError(t, err)
		require.True(t, won)
		return rec
	}
	claim("pending", time.Hour)
	claim("nolease", 0)
	claim("lapsed", time.Microsecond)
	c := claim("value", time.Hour)
	c.Value = []byte("the result \x00\xff")
	require.NoError(t, bb.Complete(ctx, c, now, time.Hour))
	c = claim("empty", time.Hour)
	c.Value = []byte{}
	require.NoError(t, bb.Complete(ctx, c, now, time.Hour))
	c = claim("failed", time.Hour)
	c.Failed, c.ErrMsg = true, "card declined ✗"
	require.NoError(t, bb.Complete(ctx, c, now, time.Hour))
	c = claim("steps", time.Hour)
	require.NoError(t, bb.RecordStep(ctx, "steps", c.Token, backend.Step{Name: "charge", Value: []byte("ch_1")}, now))
	require.NoError(t, bb.RecordStep(ctx, "steps", c.Token, backend.Step{Name: "mail", Failed: true, ErrMsg: "bounced"}, now))

	same := func(t *testing.T, want, got backend.Record) {
		t.Helper()
		for _, p := range []struct{ w, g *time.Time }{{&want.CreatedAt, &got.CreatedAt}, {&want.ExpiresAt, &got.ExpiresAt}, {&want.LeaseUntil, &got.LeaseUntil}} {
			assert.True(t, p.w.Equal(*p.g), "%v against %v", *p.w, *p.g)
			*p.w, *p.g = time.Time{}, time.Time{}
		}
		for i := range min(len(want.Steps), len(got.Steps)) {
			assert.True(t, want.Steps[i].At.Equal(got.Steps[i].At))
			want.Steps[i].At, got.Steps[i].At = time.Time{}, time.Time{}
		}
		assert.Equal(t, want, got)
	}
	keys := []string{"pending", "nolease", "lapsed", "value", "empty", "failed", "steps"}
	for _, key := range keys {
		want, ok, err := tb.Get(ctx, key, now)
		require.NoError(t, err)
		require.True(t, ok, key)
		got, ok, err := bb.Get(ctx, key, now)
		require.NoError(t, err)
		require.True(t, ok, key)
		same(t, want, got)
		// A claim that finds the record answers it the same way.
		want, won, err := tb.Claim(ctx, backend.Record{Key: key, Token: "other", Fingerprint: fp}, now, time.Hour)
		require.NoError(t, err)
		require.False(t, won)
		got, won, err = bb.Claim(ctx, backend.Record{Key: key, Token: "other", Fingerprint: fp}, now, time.Hour)
		require.NoError(t, err)
		require.False(t, won)
		same(t, want, got)
	}
	assert.Equal(t, backend.StateInterrupted, mustGet(t, bb, "lapsed").State)
	assert.Equal(t, []byte{}, mustGet(t, bb, "empty").Value, "an empty value is not NULL")
	assert.Len(t, mustGet(t, bb, "steps").Steps, 2)

	var fromText, fromBinary []backend.Record
	require.NoError(t, tb.Each(ctx, func(r backend.Record) error { fromText = append(fromText, r); return nil }))
	require.NoError(t, bb.Each(ctx, func(r backend.Record) error { fromBinary = append(fromBinary, r); return nil }))
	require.Len(t, fromBinary, len(keys))
	require.Len(t, fromText, len(keys))
	for i := range fromText {
		same(t, fromText[i], fromBinary[i])
	}
}

func mustGet(t *testing.T, b *Backend, key string) backend.Record {
	t.Helper()
	rec, ok, err := b.Get(context.Background(), key, time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	return rec
}

// The default pool's rows take decodeRow's path, not rows.Scan's: the
// allocations it saves are saved.
func TestDecodeRowTakesBinaryRows(t *testing.T) {
	pool := modePool(t, pgx.QueryExecModeCacheStatement)
	b, _ := testBackend(t, pool)
	ctx := context.Background()
	_, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Hour)
	require.NoError(t, err)
	for _, q := range []struct {
		sql   string
		args  []any
		extra []any
	}{
		{b.q.get, []any{"k"}, nil},
		{b.q.claim, []any{"k", make([]byte, 32), "t2", int64(1), int64(1)}, []any{new(bool), new(bool)}},
	} {
		rows, err := pool.Query(ctx, q.sql, q.args...)
		require.NoError(t, err)
		require.True(t, rows.Next())
		var r row
		assert.True(t, decodeRow(rows.FieldDescriptions(), rows.RawValues(), &r, q.extra), q.sql)
		assert.Equal(t, "k", r.rec.Key)
		rows.Close()
		require.NoError(t, rows.Err())
	}
}
