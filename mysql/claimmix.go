package mysql

import "sync/atomic"

// claimMix is how often a Backend's recent claims met a record (a replay,
// a conflict, a claim in flight) rather than a new key: a moving average,
// each claim weighing a sixteenth, in 1/65536ths. It chooses how a claim
// is sent on MariaDB (claimOnce): a claim that meets a record costs the
// insert-alone way a second round trip, about twice what INSERT ...
// RETURNING costs a new key more than the insert alone does (its result
// set), so RETURNING is used once more than a third of claims meet one.
// Updates race, and one lost now and then only delays the switch; the
// choice is never a question of correctness, only of cost.
type claimMix struct {
	met atomic.Uint32
	// pinned keeps met as it is: a test's, to claim in one way only.
	pinned bool
}

const (
	mixOne       = 1 << 16
	mixReturning = mixOne / 3
)

// returning reports whether a claim should be sent with RETURNING.
func (m *claimMix) returning() bool { return m.met.Load() > mixReturning }

// note counts a claim: met, whether it met a record.
func (m *claimMix) note(met bool) {
	if m.pinned {
		return
	}
	old := m.met.Load()
	v := old - old/16
	if met {
		v += mixOne / 16
	}
	if v != old {
		m.met.Store(v)
	}
}
