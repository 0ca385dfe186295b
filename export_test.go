package idem

import "github.com/seed094d4201/idem/internal/lifecycle"

// HearMoves makes hear hear every move of every entry's lifecycle, with
// its shard locked, until the returned func is called. For the tests of
// package idem_test; one at a time.
func HearMoves(hear func(key string, from lifecycle.Phase, ev lifecycle.Event, m lifecycle.Move)) (stop func()) {
	testHookMove.Store(&hear)
	return func() { testHookMove.Store(nil) }
}
