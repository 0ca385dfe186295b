package postgres

import (
	"context"
	"strings"
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

// decodeRow against rows.Scan on the same binary row, for values and
// column types the backend's own statements rarely return: instants
// before 2000 and 1970 (negative microseconds, negative remainders),
// infinities, the extremes of the range, NULLs where the table allows
// them and where it does not, other integer widths for the state, other
// text types, a large bytea. Wherever decodeRow takes a row, it reads what
// rows.Scan reads; where it declines, scanRow's rows.Scan answers.
func TestDecodeRowAgreesWithScanOnOddRows(t *testing.T) {
	pool := modePool(t, pgx.QueryExecModeCacheStatement)
	ctx := context.Background()
	// Another session zone than the process's: binary instants carry none.
	_, err := pool.Exec(ctx, "SET TIME ZONE 'Asia/Kathmandu'")
	require.NoError(t, err)

	base := []string{
		"'k'::text", "'\\x" + strings.Repeat("ab", 32) + "'::bytea", "'tok'::text", "1::smallint",
		"'2026-01-02 03:04:05.678901+00'::timestamptz", "NULL::timestamptz", "NULL::timestamptz",
		"NULL::bytea", "false", "''::text", "NULL::bytea",
	}
	with := func(i int, expr string) []string {
		cols := append([]string(nil), base...)
		cols[i] = expr
		return cols
	}
	type want int
	const (
		either  want = iota // decodeRow may take it or leave it to rows.Scan
		decoded             // decodeRow must take it
		refused             // rows.Scan refuses it, and so must scanRow
	)
	cases := []struct {
		name string
		cols []string
		want want
	}{
		{"base", base, decoded},
		{"before 2000", with(4, "'1999-12-31 23:59:59.999999+00'::timestamptz"), decoded},
		{"before 1970", with(4, "'1969-12-31 23:59:59.000001+00'::timestamptz"), decoded},
		{"one microsecond before 1970", with(4, "'1969-12-31 23:59:59.999999+00'::timestamptz"), decoded},
		{"4713 BC", with(4, "'4713-01-01 00:00:00+00 BC'::timestamptz"), decoded},
		{"another zone's offset", with(5, "'2026-06-30 23:59:59.5-09:30'::timestamptz"), decoded},
		{"lease in 200000 AD", with(6, "'200000-01-01 00:00:00+00'::timestamptz"), decoded},
		{"the last instant PostgreSQL holds", with(5, "'294276-12-31 23:59:59.999999+00'::timestamptz"), decoded},
		{"infinite expiry", with(5, "'infinity'::timestamptz"), refused},
		{"-infinite creation", with(4, "'-infinity'::timestamptz"), refused},
		{"NULL creation", with(4, "NULL::timestamptz"), refused},
		{"timestamp without zone", with(4, "'2026-01-02 03:04:05'::timestamp"), either},
		{"state int4", with(3, "2::integer"), decoded},
		{"state int8 negative", with(3, "(-3)::bigint"), decoded},
		{"state smallint min", with(3, "(-32768)::smallint"), decoded},
		{"state past smallint", with(3, "70000::integer"), refused},
		{"state numeric", with(3, "2::numeric"), either},
		{"state NULL", with(3, "NULL::smallint"), refused},
		{"key varchar", with(0, "'k,\"\\ é'::varchar(255)"), decoded},
		{"key char(3)", with(0, "'k'::char(3)"), either},
		{"key name", with(0, "'k'::name"), either},
		{"key NULL", with(0, "NULL::text"), refused},
		{"token NULL", with(2, "NULL::text"), refused},
		{"fingerprint NULL", with(1, "NULL::bytea"), either},
		{"fingerprint empty", with(1, "''::bytea"), decoded},
		{"value empty", with(7, "''::bytea"), decoded},
		{"value 4 MiB", with(7, "decode(repeat('00ff', 2097152), 'hex')"), decoded},
		{"failed NULL", with(8, "NULL::boolean"), refused},
		{"err_msg NULL", with(9, "NULL::text"), refused},
		{"err_msg with NUL-free controls", with(9, "E'line\\none\\ttab ✗'::text"), decoded},
		{"steps empty", with(10, "''::bytea"), decoded},
		{"steps text", with(10, "'x'::text"), either},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows, err := pool.Query(ctx, "SELECT true, "+strings.Join(c.cols, ", "))
			require.NoError(t, err)
			defer rows.Close()
			require.True(t, rows.Next(), "%v", rows.Err())
			var dec, scan row
			var decExtra, scanExtra bool
			ok := decodeRow(rows.FieldDescriptions(), rows.RawValues(), &dec, []any{&decExtra})
			serr := rows.Scan(&scanExtra, &scan.rec.Key, &scan.fp, &scan.rec.Token, &scan.state, &scan.rec.CreatedAt, &scan.expires, &scan.lease, &scan.rec.Value, &scan.rec.Failed, &scan.rec.ErrMsg, &scan.steps)
			switch c.want {
			case decoded:
				require.True(t, ok, "decodeRow left a row of the table's types to rows.Scan")
			case refused:
				require.Error(t, serr)
				require.False(t, ok, "decodeRow took a row rows.Scan refuses")
			}
			if !ok {
				return
			}
			require.NoError(t, serr, "decodeRow took a row rows.Scan refuses")
			assert.Equal(t, scanExtra, decExtra)
			assert.Equal(t, scan.scanned(), dec.scanned())
		})
	}
}

// scanned is r as rows.Scan fills it: the instants its pointers point to
// copied out, the storage decodeRow points them into and the key and
// token it compares with left out.
func (r row) scanned() row {
	out := row{rec: r.rec, fp: r.fp, steps: r.steps, state: r.state}
	if r.expires != nil {
		t := *r.expires
		out.expires = &t
	}
	if r.lease != nil {
		t := *r.lease
		out.lease = &t
	}
	return out
}
