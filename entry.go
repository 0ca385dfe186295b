package idem

import "time"

// An entry is one key's claim in memory: in flight until its outcome is set,
// then either removed (failure before commit) or kept as completed until it
// expires.
type entry[R any] struct {
	key   string
	fp    Fingerprint // of the payload that claimed the key; immutable
	shard *shard[R]   // holds the entry; immutable, saves hashing the key again

	// Guarded by shard.mu.
	completed  bool      // the outcome is final and replays until expires
	expires    time.Time // set when completed; zero for a pinned entry, which stays until unpinned
	prev, next *entry[R] // the shard's expiry list, completed entries only

	// done is closed once the outcome is set. The first caller that needs to
	// wait makes it, under shard.mu, and it is never replaced, so a claim can
	// hand it to a waiter that then reads it unlocked. Nil while nobody waits:
	// most executions never pay for a channel.
	done chan struct{}

	// Written only by the execution, before completed is set or done is
	// closed; read only after observing either.
	val    R
	err    error
	shared bool // the outcome is final (recorded or replayed): waiters replay it rather than fail with it
}

// expiryList holds a shard's completed entries in completion order. With one
// TTL for the whole store, completion order is expiry order, so the expired
// entries are always a prefix and a sweep touches only what it removes.
type expiryList[R any] struct {
	head, tail *entry[R]
}

func (l *expiryList[R]) pushBack(e *entry[R]) {
	e.prev, e.next = l.tail, nil
	if l.tail == nil {
		l.head = e
	} else {
		l.tail.next = e
	}
	l.tail = e
}

func (l *expiryList[R]) remove(e *entry[R]) {
	if e.prev == nil {
		l.head = e.next
	} else {
		e.prev.next = e.next
	}
	if e.next == nil {
		l.tail = e.prev
	} else {
		e.next.prev = e.prev
	}
	e.prev, e.next = nil, nil
}
