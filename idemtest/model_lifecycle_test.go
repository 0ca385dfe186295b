package idemtest_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/seed094d4201/idem/internal/lifecycle"
)

// TestModelFailsWithoutALifecycleMove removes one row of the key
// lifecycle's table at a time, in a child process, and runs the model
// there: each run must fail, naming the move the table lacks. A model
// that passed would not be checking the Store against the table.
func TestModelFailsWithoutALifecycleMove(t *testing.T) {
	if row := os.Getenv("IDEM_MODEL_WITHOUT"); row != "" {
		modelWithout(t, row)
		return
	}
	rows := []struct {
		from    lifecycle.Phase
		ev      lifecycle.Event
		backend bool
	}{
		{lifecycle.Claiming, lifecycle.Confirm, true},
		{lifecycle.Running, lifecycle.Release, true},
		{lifecycle.Running, lifecycle.Complete, false},
		{lifecycle.Completed, lifecycle.Call, false},
	}
	for _, r := range rows {
		row := fmt.Sprintf("%d/%d/%v", r.from, r.ev, r.backend)
		t.Run(fmt.Sprintf("%v_on_%v", r.ev, r.from), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestModelFailsWithoutALifecycleMove$", "-test.count=1",
				"-rapid.nofailfile", "-rapid.shrinktime=1s")
			cmd.Env = append(os.Environ(), "IDEM_MODEL_WITHOUT="+row, "IDEM_MODEL_BUDGET=30s")
			out, err := cmd.CombinedOutput()
			want := fmt.Sprintf("%v on %v", r.ev, r.from) // the invariant, or the error the Store answered
			switch {
			case err == nil:
				t.Fatalf("the model passed without %v on %v:\n%s", r.ev, r.from, tail(out))
			case !bytes.Contains(out, []byte(want)):
				t.Fatalf("the model failed without %v on %v, but not for it (want %q):\n%s", r.ev, r.from, want, tail(out))
			}
		})
	}
}

// modelWithout is the child: the model, with row removed from the table.
func modelWithout(t *testing.T, row string) {
	var from, ev int
	var withBackend bool
	if _, err := fmt.Sscanf(row, "%d/%d/%t", &from, &ev, &withBackend); err != nil {
		t.Fatalf("IDEM_MODEL_WITHOUT=%q: %v", row, err)
	}
	defer lifecycle.Without(lifecycle.Phase(from), lifecycle.Event(ev))()
	h := idemtest.Harness{}
	if withBackend {
		h.Backend = func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }
	}
	idemtest.RunModel(t, h)
}

func tail(out []byte) []byte {
	if len(out) > 4000 {
		return out[len(out)-4000:]
	}
	return out
}
