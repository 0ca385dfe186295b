package backend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// recordVersion is the first byte of every binary record; a new layout gets
// a new version so that old files stay readable.
const recordVersion = 3 // 2 added LeaseUntil, 3 Steps

// A record without steps is still written as version 2, byte for byte as
// before, so that files stay readable by the versions before steps.
const stepsVersion = 3

// MarshalBinary encodes r compactly, for backends that store records as
// opaque values. UnmarshalBinary reads it back field for field; times come
// back as the same instants, in UTC-less local form, and an empty Value as
// nil or empty alike.
func (r Record) MarshalBinary() ([]byte, error) {
	if len(r.Key) > 255 { // its length is one byte; idem.MaxKeyLen is 255
		return nil, fmt.Errorf("idem: record key of %d bytes, more than 255", len(r.Key))
	}
	n := 1 + 1 + 1 + len(r.Key) + len(r.Fingerprint) + 1 + len(r.Token) + 3*8 + 1 +
		binary.MaxVarintLen64 + len(r.ErrMsg) + binary.MaxVarintLen64 + len(r.Value)
	b := make([]byte, 0, n)
	b = append(b, 2, byte(r.State), byte(len(r.Key)))
	b = append(b, r.Key...)
	b = append(b, r.Fingerprint[:]...)
	if len(r.Token) > 255 {
		return nil, errors.New("idem: record token longer than 255 bytes")
	}
	b = append(b, byte(len(r.Token)))
	b = append(b, r.Token...)
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(r.CreatedAt)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(r.ExpiresAt)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(r.LeaseUntil)))
	var failed byte
	if r.Failed {
		failed = 1
	}
	b = append(b, failed)
	b = binary.AppendUvarint(b, uint64(len(r.ErrMsg)))
	b = append(b, r.ErrMsg...)
	b = binary.AppendUvarint(b, uint64(len(r.Value)))
	b = append(b, r.Value...)
	if len(r.Steps) == 0 {
		return b, nil
	}
	b[0] = stepsVersion
	return AppendSteps(b, r.Steps), nil
}

// AppendSteps appends steps to b in the layout a record holds them in, for
// backends that keep a record's steps apart from it (a column of their own);
// ReadSteps reads them back.
func AppendSteps(b []byte, steps []Step) []byte {
	b = binary.AppendUvarint(b, uint64(len(steps)))
	for _, s := range steps {
		b = binary.AppendUvarint(b, uint64(len(s.Name)))
		b = append(b, s.Name...)
		b = binary.BigEndian.AppendUint64(b, uint64(unixNano(s.At)))
		var failed byte
		if s.Failed {
			failed = 1
		}
		b = append(b, failed)
		b = binary.AppendUvarint(b, uint64(len(s.ErrMsg)))
		b = append(b, s.ErrMsg...)
		b = binary.AppendUvarint(b, uint64(len(s.Value)))
		b = append(b, s.Value...)
	}
	return b
}

// errBadRecord is returned by UnmarshalBinary for bytes that are not a record.
var errBadRecord = errors.New("idem: malformed record")

// UnmarshalBinary decodes a record made by MarshalBinary. Value aliases
// nothing in data: it is a copy.
func (r *Record) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	version := d.byte()
	if version < 1 || version > recordVersion {
		return fmt.Errorf("%w: version %d", errBadRecord, version)
	}
	rec := Record{State: RecordState(d.byte())}
	rec.Key = string(d.bytes(int(d.byte())))
	copy(rec.Fingerprint[:], d.bytes(len(rec.Fingerprint)))
	rec.Token = string(d.bytes(int(d.byte())))
	rec.CreatedAt = fromUnixNano(int64(d.uint64()))
	rec.ExpiresAt = fromUnixNano(int64(d.uint64()))
	if version >= 2 {
		rec.LeaseUntil = fromUnixNano(int64(d.uint64()))
	}
	rec.Failed = d.byte() == 1
	rec.ErrMsg = string(d.bytes(d.uvarint()))
	rec.Value = bytes.Clone(d.bytes(d.uvarint()))
	if version >= stepsVersion {
		rec.Steps = d.steps()
	}
	switch {
	case d.err != nil:
		return d.err
	case len(d.b) != 0:
		return fmt.Errorf("%w: %d trailing bytes", errBadRecord, len(d.b))
	case rec.State < StatePending || rec.State > StateInterrupted:
		return fmt.Errorf("%w: state %d", errBadRecord, rec.State)
	}
	*r = rec
	return nil
}

// ReadSteps reads steps that AppendSteps wrote; no bytes means none.
func ReadSteps(data []byte) ([]Step, error) {
	if len(data) == 0 {
		return nil, nil
	}
	d := decoder{b: data}
	steps := d.steps()
	switch {
	case d.err != nil:
		return nil, d.err
	case len(d.b) != 0:
		return nil, fmt.Errorf("%w: %d trailing bytes after the steps", errBadRecord, len(d.b))
	}
	return steps, nil
}

func (d *decoder) steps() []Step {
	var steps []Step
	n := d.uvarint()
	for i := 0; i < n && d.err == nil; i++ {
		var s Step
		s.Name = string(d.bytes(d.uvarint()))
		s.At = fromUnixNano(int64(d.uint64()))
		s.Failed = d.byte() == 1
		s.ErrMsg = string(d.bytes(d.uvarint()))
		s.Value = bytes.Clone(d.bytes(d.uvarint()))
		steps = append(steps, s)
	}
	return steps
}

// decoder reads fields off b, remembering the first shortfall.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		if d.err == nil {
			d.err = fmt.Errorf("%w: truncated", errBadRecord)
		}
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if v := d.bytes(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) uint64() uint64 {
	if v := d.bytes(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) uvarint() int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: bad length", errBadRecord)
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

// zeroTime stands for the zero Time, which has no Unix nanosecond count of
// its own; every other instant, the Unix epoch included, keeps its own.
const zeroTime = math.MinInt64

// unixNano is t in nanoseconds since 1970, with the zero Time as zeroTime.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return zeroTime
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == zeroTime {
		return time.Time{}
	}
	return time.Unix(0, n)
}
