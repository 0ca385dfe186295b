package idemtest

import (
	"testing"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
)

// recorder is a tester that notes whether a check failed.
type recorder struct{ failed bool }

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Helper()               {}

// The suite's check of Claim's answers catches the malformed answers of
// issue 18, (Record{}, true, nil) first, and passes the valid ones.
func TestWellFormedClaimCheck(t *testing.T) {
	req := request("k")
	standing := request("k")
	standing.State = backend.StateCompleted
	for _, tc := range []struct {
		name string
		got  backend.Record
		won  bool
		ok   bool
	}{
		{"zero record, claimed", backend.Record{}, true, false},
		{"claimed without the caller's token", backend.Record{Key: "k", Fingerprint: req.Fingerprint, State: backend.StatePending}, true, false},
		{"claimed with another fingerprint", backend.Record{Key: "k", Token: req.Token, State: backend.StatePending}, true, false},
		{"claimed, not pending", backend.Record{Key: "k", Fingerprint: req.Fingerprint, Token: req.Token, State: backend.StateCompleted}, true, false},
		{"claimed, another key", backend.Record{Key: "j", Fingerprint: req.Fingerprint, Token: req.Token, State: backend.StatePending}, true, false},
		{"zero record, not claimed", backend.Record{}, false, false},
		{"standing without a token", backend.Record{Key: "k", State: backend.StateCompleted}, false, false},
		{"standing without a state", backend.Record{Key: "k", Token: "t"}, false, false},
		{"standing with an invalid state", backend.Record{Key: "k", Token: "t", State: backend.StateInterrupted + 1}, false, false},
		{"claimed", req, true, true},
		{"standing", standing, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			assertWellFormed(&r, req, tc.got, tc.won)
			assert.Equal(t, !tc.ok, r.failed, "the check failed")
		})
	}
}
