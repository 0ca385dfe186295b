package postgres

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/seed094d4201/idem/backend"
)

// A row is a record's columns as they are read, before they are checked.
//
// key and token, set before a row is read, are the strings the row's key
// and token are taken as where their bytes are the same (a claim's own),
// with no copy. expires and lease point to expiresAt and leaseUntil when
// they are not NULL. fp is the row's bytes, not a copy: it is read before
// the next row.
type row struct {
	rec                   backend.Record
	fp, steps             []byte
	state                 int16
	expires, lease        *time.Time
	key, token            string
	expiresAt, leaseUntil time.Time
}

// scanRow reads rows' current row into r, after the leading columns given
// as extra destinations. A row in the binary wire form of the types the
// statements return (what pgx asks for unless the pool is set to a text
// protocol; text columns come as text, the same bytes) is decoded here, without pgx's per-query scan plans (some 20
// allocations a claim, by profile); any other goes through rows.Scan,
// which also words every error.
func scanRow(rows pgx.Rows, r *row, extra []any) error {
	if decodeRow(rows.FieldDescriptions(), rows.RawValues(), r, extra) {
		return nil
	}
	*r = row{}
	dest := append(extra, &r.rec.Key, &r.fp, &r.rec.Token, &r.state, &r.rec.CreatedAt, &r.expires, &r.lease, &r.rec.Value, &r.rec.Failed, &r.rec.ErrMsg, &r.steps)
	return rows.Scan(dest...)
}

// decodeRow decodes a row of binary (and text) columns into r and extra (each a
// *bool), and reports false, having decoded nothing that matters, for
// anything it does not expect: another type, a text column, a NULL where
// the table allows none, an infinite instant.
func decodeRow(fds []pgconn.FieldDescription, vals [][]byte, r *row, extra []any) bool {
	if len(fds) != len(extra)+11 || len(vals) != len(fds) {
		return false
	}
	for i, e := range extra {
		b, ok := e.(*bool)
		if !ok || !boolean(fds[i], vals[i], b) {
			return false
		}
	}
	fds, vals = fds[len(extra):], vals[len(extra):]
	var state int64
	ok := text(fds[0], vals[0], &r.rec.Key, r.key) &&
		byteaRef(fds[1], vals[1], &r.fp) && r.fp != nil &&
		text(fds[2], vals[2], &r.rec.Token, r.token) &&
		integer(fds[3], vals[3], &state) && state >= math.MinInt16 && state <= math.MaxInt16 &&
		instant(fds[4], vals[4], &r.rec.CreatedAt) &&
		nullInstant(fds[5], vals[5], &r.expires, &r.expiresAt) &&
		nullInstant(fds[6], vals[6], &r.lease, &r.leaseUntil) &&
		bytea(fds[7], vals[7], &r.rec.Value) &&
		boolean(fds[8], vals[8], &r.rec.Failed) &&
		text(fds[9], vals[9], &r.rec.ErrMsg, "") &&
		fds[10].DataTypeOID == pgtype.ByteaOID && fds[10].Format == pgx.BinaryFormatCode
	if !ok {
		return false
	}
	r.state = int16(state)
	r.steps = vals[10] // ReadSteps copies what it keeps
	return true
}

// text reads a text column in either format: pgx asks for text in text
// form, which is the same bytes. It is known where its bytes are known's
// (a claim's own key and token), and then not copied.
func text(fd pgconn.FieldDescription, v []byte, dst *string, known string) bool {
	if v == nil || (fd.DataTypeOID != pgtype.TextOID && fd.DataTypeOID != pgtype.VarcharOID) {
		return false
	}
	if string(v) == known {
		*dst = known
	} else {
		*dst = string(v)
	}
	return true
}

// bytea copies v: pgx reuses the buffer for the next row. NULL is nil.
func bytea(fd pgconn.FieldDescription, v []byte, dst *[]byte) bool {
	if fd.DataTypeOID != pgtype.ByteaOID || fd.Format != pgx.BinaryFormatCode {
		return false
	}
	if v != nil {
		*dst = append(make([]byte, 0, len(v)), v...)
	}
	return true
}

// byteaRef is bytea without the copy: dst holds pgx's buffer, which the
// next row reuses. NULL is nil.
func byteaRef(fd pgconn.FieldDescription, v []byte, dst *[]byte) bool {
	if fd.DataTypeOID != pgtype.ByteaOID || fd.Format != pgx.BinaryFormatCode {
		return false
	}
	*dst = v
	return true
}

func boolean(fd pgconn.FieldDescription, v []byte, dst *bool) bool {
	if fd.DataTypeOID != pgtype.BoolOID || fd.Format != pgx.BinaryFormatCode || len(v) != 1 {
		return false
	}
	*dst = v[0] != 0
	return true
}

func integer(fd pgconn.FieldDescription, v []byte, dst *int64) bool {
	switch {
	case fd.Format != pgx.BinaryFormatCode:
		return false
	case fd.DataTypeOID == pgtype.Int2OID && len(v) == 2:
		*dst = int64(int16(binary.BigEndian.Uint16(v)))
	case fd.DataTypeOID == pgtype.Int4OID && len(v) == 4:
		*dst = int64(int32(binary.BigEndian.Uint32(v)))
	case fd.DataTypeOID == pgtype.Int8OID && len(v) == 8:
		*dst = int64(binary.BigEndian.Uint64(v))
	default:
		return false
	}
	return true
}

// unixToY2K is the microseconds from the Unix epoch to PostgreSQL's,
// 2000-01-01 00:00:00 UTC, from which a timestamptz counts.
const unixToY2K = 946_684_800_000_000

// instant decodes a timestamptz as pgx does (time.Unix: the local zone).
// An infinite one is left to rows.Scan, which refuses it.
func instant(fd pgconn.FieldDescription, v []byte, dst *time.Time) bool {
	if fd.DataTypeOID != pgtype.TimestamptzOID || fd.Format != pgx.BinaryFormatCode || len(v) != 8 {
		return false
	}
	us := int64(binary.BigEndian.Uint64(v))
	if us == math.MaxInt64 || us == math.MinInt64 {
		return false
	}
	*dst = time.Unix(unixToY2K/1_000_000+us/1_000_000, (unixToY2K%1_000_000*1000)+(us%1_000_000*1000))
	return true
}

// nullInstant decodes a timestamptz that may be NULL into *t, and points
// dst to it; NULL leaves dst as it is (nil).
func nullInstant(fd pgconn.FieldDescription, v []byte, dst **time.Time, t *time.Time) bool {
	if v == nil {
		return fd.DataTypeOID == pgtype.TimestamptzOID && fd.Format == pgx.BinaryFormatCode
	}
	if !instant(fd, v, t) {
		return false
	}
	*dst = t
	return true
}
