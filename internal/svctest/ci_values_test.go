package svctest

import (
	"strings"
	"testing"
)

// CI services do not all set CI to a boolean (Woodpecker sets
// CI=woodpecker): any value but an empty or false one is CI, where a
// missing service fails its test rather than skip it unseen.
func TestSkipfFailsForAnyCIValueButFalse(t *testing.T) {
	for ci, fails := range map[string]bool{
		"woodpecker": true, "yes": true, "TRUE": true,
		"": false, "false": false, "0": false, "False": false,
	} {
		t.Setenv("CI", ci)
		got := skipf("no X")
		if strings.HasPrefix(got, "fatal: ") != fails {
			t.Errorf("CI=%q: %q, want it to fail: %v", ci, got, fails)
		}
	}
}
