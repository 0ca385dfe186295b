package idemtest_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
)

// suiteFailsIn runs test (this binary's test of that name) in a child
// process with env set to value, limited to subtests, where it runs Run
// over a backend that breaks one rule, and checks that Run failed it in
// each of subtests.
func suiteFailsIn(t *testing.T, test, env, value string, subtests ...string) {
	t.Helper()
	pattern := "^" + test + "$/^("
	for i, s := range subtests {
		if i > 0 {
			pattern += "|"
		}
		pattern += s
	}
	cmd := exec.Command(os.Args[0], "-test.run="+pattern+")$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+value)
	out, err := cmd.CombinedOutput()
	assert.Error(t, err, "the suite passed a backend that breaks the rule:\n%s", out)
	for _, s := range subtests {
		assert.Contains(t, string(out), "--- FAIL: "+test+"/"+s, "the suite did not fail it in %s:\n%s", s, out)
	}
}

// eachDropper's Each lists records with one field dropped, as a backend
// whose listing query forgot a column would: Get still reads every field,
// so only a check of Each itself sees it.
type eachDropper struct {
	*idemtest.MemoryBackend
	drop func(*backend.Record)
}

func (b eachDropper) Each(ctx context.Context, fn func(backend.Record) error) error {
	return b.MemoryBackend.Each(ctx, func(rec backend.Record) error {
		b.drop(&rec)
		return fn(rec)
	})
}

// eachDrops are the fields an eachDropper drops, by name.
var eachDrops = map[string]func(*backend.Record){
	"Value":  func(r *backend.Record) { r.Value = nil },
	"Steps":  func(r *backend.Record) { r.Steps = nil },
	"Failed": func(r *backend.Record) { r.Failed, r.ErrMsg = false, "" },
	"ExpiresAt": func(r *backend.Record) {
		r.ExpiresAt = time.Time{}
	},
	"StepValues": func(r *backend.Record) {
		for i := range r.Steps {
			r.Steps[i].Value = nil
		}
	},
	"StepErrors": func(r *backend.Record) {
		for i := range r.Steps {
			r.Steps[i].Failed, r.Steps[i].ErrMsg = false, ""
		}
	},
}

// Run fails a backend whose Each drops any field Complete or RecordStep
// wrote. It passed one whose Each dropped Value, or Steps, before.
func TestConformanceFailsAnEachThatDropsAField(t *testing.T) {
	if field := os.Getenv("IDEMTEST_EACH_DROPS"); field != "" {
		idemtest.Run(t, func(*testing.T) backend.Backend {
			return eachDropper{idemtest.NewMemoryBackend(), eachDrops[field]}
		})
		return
	}
	for field := range eachDrops {
		t.Run(field, func(t *testing.T) {
			suiteFailsIn(t, "TestConformanceFailsAnEachThatDropsAField", "IDEMTEST_EACH_DROPS", field, "EachReturnsEveryField")
		})
	}
}

// earlySweeper's Sweep deletes what has expired a second from now: every
// completed record in the last second of its life, as a backend would
// that compared with <= against an instant rounded up to the second, or
// added a second's slack the wrong way.
type earlySweeper struct{ *idemtest.MemoryBackend }

func (b earlySweeper) Sweep(ctx context.Context, now time.Time, limit int) (int, error) {
	return b.MemoryBackend.Sweep(ctx, now.Add(time.Second), limit)
}

// Run fails a backend whose Sweep acts a second early, by the caller's
// now (SweepSparesUntilExpiry) and by the real time
// (SweepWaitsForExpiry). It passed such a backend before.
func TestConformanceFailsAnEarlySweep(t *testing.T) {
	if os.Getenv("IDEMTEST_EARLY_SWEEP") != "" {
		idemtest.Run(t, func(*testing.T) backend.Backend { return earlySweeper{idemtest.NewMemoryBackend()} })
		return
	}
	suiteFailsIn(t, "TestConformanceFailsAnEarlySweep", "IDEMTEST_EARLY_SWEEP", "1", "SweepSparesUntilExpiry", "SweepWaitsForExpiry")
}
