package backend

import (
	"context"
	"time"
)

// A Step is one recovery point of an operation: a named part of its work
// whose outcome was recorded, under the operation's key, as soon as the
// part finished, so that a later run of the operation (a retry, or a
// resumption after its process died) returns that outcome instead of doing
// the part again.
type Step struct {
	Name string
	At   time.Time // when it was recorded, by the backend's clock

	// Its outcome, as a Record holds one: the result encoded by the
	// Store's Codec and, for a final error, that error's message.
	Value  []byte
	Failed bool
	ErrMsg string
}

// A Stepper is a Backend that records steps, for operations that resume
// rather than end interrupted. bolt, sqlite, postgres, mysql, redis and
// idemtest's MemoryBackend implement it.
type Stepper interface {
	Backend

	// RecordStep appends step to key's pending record, its At set to the
	// backend's now, if the record's Token equals token and its lease has
	// not lapsed; a step of the same name already there is replaced.
	// Otherwise it changes nothing and returns an error matching
	// ErrNotOwner: a stale owner, whose claim was taken over, can never
	// record a step. When it returns nil, the step is durable.
	RecordStep(ctx context.Context, key, token string, step Step, now time.Time) error

	// Resume takes over key's interrupted record (pending, its lease
	// lapsed) whose Token equals old: it gives it token, a lease of lease
	// after the backend's now, and State pending, and keeps its
	// Fingerprint, CreatedAt and Steps; it returns the record as it now
	// stands. Otherwise it changes nothing and returns an error matching
	// ErrNotOwner. Of any number of concurrent Resumes of one record,
	// exactly one succeeds.
	Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (Record, error)
}

// WithStep returns r with s recorded: appended, or in place of the step of
// the same name. r's own Steps are not changed.
func (r Record) WithStep(s Step) Record {
	steps := make([]Step, 0, len(r.Steps)+1)
	for _, old := range r.Steps {
		if old.Name != s.Name {
			steps = append(steps, old)
		}
	}
	r.Steps = append(steps, s)
	return r
}
