package svctest

import (
	"fmt"
	"runtime"
	"testing"
)

// recorder is a testing.TB that records how Skipf ended it. Like the real
// one, it ends its goroutine on Skip and Fatalf.
type recorder struct {
	testing.TB
	ended string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.ended = "skip: " + fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = "fatal: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// skipf runs Skipf on a recorder in a goroutine of its own, as a test
// runs, and returns how it ended.
func skipf(format string, args ...any) string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Skipf(r, format, args...)
	}()
	<-done
	return r.ended
}

func TestSkipfSkipsOutsideCI(t *testing.T) {
	for _, ci := range []string{"", "false", "0"} {
		t.Setenv("CI", ci)
		if got, want := skipf("IDEM_%s is not set", "X"), "skip: IDEM_X is not set"; got != want {
			t.Errorf("CI=%q: %q, want %q", ci, got, want)
		}
	}
}

func TestSkipfFailsInCI(t *testing.T) {
	for _, ci := range []string{"true", "1"} {
		t.Setenv("CI", ci)
		want := "fatal: IDEM_X is not set (CI is set: there a test that needs a service fails instead of skipping)"
		if got := skipf("IDEM_%s is not set", "X"); got != want {
			t.Errorf("CI=%q: %q, want %q", ci, got, want)
		}
	}
}
