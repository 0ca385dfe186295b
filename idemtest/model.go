package idemtest

import (
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem/internal/svctest"
	"pgregory.net/rapid"
)

// RunModel drives stores over the backends h makes with random sequences
// of calls, faults, kills, restarts and clock steps (pgregory.net/rapid's
// state machine), and checks every answer and the backend's records
// against a model of the contract (DESIGN.md, "The contract"):
//
//   - at most one execution of a key per epoch, an epoch ending only where
//     the contract lets the key run again: a failure before commit, a
//     Forget, an expiry, a dead or stalled owner's key taken over with
//     RetryInterrupted or Resume, a ticket dropped or released;
//   - a step recorded under a key never runs again for that record;
//   - every answer is one the model allows: a replay is an outcome the key
//     was given, a backend error comes only with a fault, a caller's ctx
//     bounds its wait;
//   - once faults heal, owners finish and leases lapse, no key is left in
//     flight, every key answers, and Close returns.
//
// A memory-only store (a nil h.Backend) runs the actions that need no
// backend. With a backend, two stores share it, as two processes would;
// h.Reopen, if set, is how a crash restarts it. Leases are short (a few
// hundred milliseconds) so that time passing on the real clock lets them
// lapse.
//
// Each run is seeded and the seed is logged; a failure prints the shrunk
// sequence of actions and the flag that replays it (-rapid.seed). The run
// stops after rapid's checks (-rapid.checks, 100 unless told) or after
// its time budget, whichever comes first: IDEM_MODEL_BUDGET (a
// time.Duration) if set, else one minute with IDEM_LONG=1 (as CI runs)
// and five seconds without (a plain go test ./...); divided by five under
// -short. The budget bounds when the last sequence starts: a backend
// whose sequences are slow (a crash reopens a file) runs past it.
func RunModel(t *testing.T, h Harness) {
	budget := modelBudget()
	seedModel(t)
	start := time.Now()
	deadline := start.Add(budget)
	runs := 0
	var failing atomic.Bool
	rapid.Check(t, func(rt *rapid.T) {
		if runs > 0 && time.Now().After(deadline) && !failing.Load() {
			// The budget is spent: the remaining checks pass at once,
			// so that rapid ends the run cleanly.
			return
		}
		runs++
		w := newWorld(t, rt, h, &failing)
		defer w.end()
		rt.Repeat(w.actions())
		w.quiesce(true)
	})
	t.Logf("model: %d sequences explored in %v (budget %v)", runs, time.Since(start).Round(time.Second), budget)
}

// modelBudget is how long RunModel explores.
func modelBudget() time.Duration {
	budget := 5 * time.Second
	if svctest.Long() {
		budget = time.Minute
	}
	if s := os.Getenv("IDEM_MODEL_BUDGET"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			budget = d
		}
	}
	if testing.Short() {
		budget /= 5
	}
	return budget
}

// seedModel makes sure the run's seed is known and logged: rapid picks a
// random one when -rapid.seed is zero, and names it only on failure.
// The seed is set once per test binary, before any RunModel reads it, so
// that parallel runs share it.
func seedModel(t *testing.T) {
	seedOnce.Do(func() {
		f := flag.Lookup("rapid.seed")
		if f == nil {
			return
		}
		seed, _ := strconv.ParseUint(f.Value.String(), 10, 64)
		if seed == 0 {
			seed = rand.Uint64()
			_ = f.Value.Set(strconv.FormatUint(seed, 10))
		}
		modelSeed = seed
	})
	t.Logf("model: seed %d (run again with -rapid.seed=%d)", modelSeed, modelSeed)
}

var (
	seedOnce  sync.Once
	modelSeed uint64 // written once, under seedOnce
)
