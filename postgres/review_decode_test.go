package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeRow against rows.Scan on the same binary row, for values and
// column types the backend's own statements rarely return: instants
// before 2000 and 1970 (negative microseconds, negative remainders),
// infinities, the extremes of the range, NULLs where the table allows
// them and where it does not, other integer widths for the state, other
// text types, a large bytea. Wherever decodeRow takes a row, it reads what
// rows.Scan reads; where it declines, scanRow's rows.Scan answers.
func TestReviewDecodeRowAgreesWithScanOnOddRows(t *testing.T) {
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
			assert.Equal(t, scan, dec)
		})
	}
}
