//go:build race

package idem_test

// raceEnabled: the tests run under the race detector, which allocates on
// some paths of its own.
const raceEnabled = true
