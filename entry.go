package idem

import (
	"time"

	"github.com/seed094d4201/idem/internal/lifecycle"
)

// An entry is one key's claim in memory. Its phase (internal/lifecycle)
// says where it is: in flight until its outcome is set, then removed
// (failure before commit, or recorded in the Backend), pinned until the
// Backend takes it, or completed until it expires.
type entry[R any] struct {
	key   string
	fp    Fingerprint // of the payload that claimed the key; immutable
	shard *shard[R]   // holds the entry; immutable, saves hashing the key again

	phase lifecycle.Phase // guarded by shard.mu; written only by table.move
	// shared: the outcome is final (recorded or replayed), so waiters
	// replay it rather than fail with it. Written and read as val and err
	// are (below). A byte beside phase's byte: apart, each padded the
	// entry to a word, and the entry took a larger size class.
	shared bool

	// Guarded by shard.mu.
	expires    time.Time      // set when Completed
	run        *expiryList[R] // the expiry run holding the entry; nil while in flight or pinned
	prev, next *entry[R]      // neighbours in run

	// done is closed once the outcome is set. The first caller that needs to
	// wait makes it, under shard.mu, and it is never replaced, so a claim can
	// hand it to a waiter that then reads it unlocked. Nil while nobody waits:
	// most executions never pay for a channel.
	done chan struct{}
	// checked is closed once the entry's claim lands in the Backend (its
	// payload is then the key's). A caller with another payload makes it,
	// under shard.mu, to learn that before the outcome (claimRecheck);
	// never replaced, so it is read unlocked like done.
	checked chan struct{}

	// Written only by the execution, before its phase leaves flight or done is
	// closed; read only after observing either.
	val R
	err error
}
