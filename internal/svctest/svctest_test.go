package svctest

import (
	"fmt"
	"net"
	"os"
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

// need runs s.need on a recorder as a test would, with CI off, and
// returns the value and how the test ended ("" if it went on).
func need(t *testing.T, s *service) (value, ended string) {
	t.Setenv("CI", "")
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		value = s.need(r)
	}()
	<-done
	return value, r.ended
}

func TestServiceVariableOverrides(t *testing.T) {
	t.Setenv("IDEM_SVCTEST_X", "db://elsewhere")
	s := &service{name: "X", env: "IDEM_SVCTEST_X", def: "db://here", dial: "127.0.0.1:1"}
	if v, ended := need(t, s); v != "db://elsewhere" || ended != "" {
		t.Fatalf("got %q (%q), want the variable's value", v, ended)
	}
}

func TestServiceEmptyVariableTurnsItOff(t *testing.T) {
	t.Setenv("IDEM_SVCTEST_X", "")
	s := &service{name: "X", env: "IDEM_SVCTEST_X", def: "db://here", dial: "127.0.0.1:1"}
	want := "skip: no X: IDEM_SVCTEST_X is set empty, which turns it off"
	if v, ended := need(t, s); v != "" || ended != want {
		t.Fatalf("got %q (%q), want %q", v, ended, want)
	}
}

func TestServiceUnsetUsesTheStandardAddressThatAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("IDEM_SVCTEST_X", "")
	os.Unsetenv("IDEM_SVCTEST_X") // t.Setenv restores it at the end
	s := &service{name: "X", env: "IDEM_SVCTEST_X", def: "db://here", dial: ln.Addr().String()}
	if v, ended := need(t, s); v != "db://here" || ended != "" {
		t.Fatalf("got %q (%q), want the standard address", v, ended)
	}
	if got := os.Getenv("IDEM_SVCTEST_X"); got != "db://here" {
		t.Errorf("the variable is %q after, want it set for child processes", got)
	}
}

func TestServiceUnsetSkipsWhenNothingAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there now
	t.Setenv("IDEM_SVCTEST_X", "")
	os.Unsetenv("IDEM_SVCTEST_X")
	s := &service{name: "X", env: "IDEM_SVCTEST_X", def: "db://here", dial: addr}
	want := "skip: no X: nothing answers at its standard address " + addr + " within 200ms and IDEM_SVCTEST_X is not set"
	if v, ended := need(t, s); v != "" || ended != want {
		t.Fatalf("got %q (%q), want %q", v, ended, want)
	}
}

func TestServiceWithNoStandardAddressSkipsWhenUnset(t *testing.T) {
	t.Setenv("IDEM_SVCTEST_X", "")
	os.Unsetenv("IDEM_SVCTEST_X")
	s := &service{name: "a cluster", env: "IDEM_SVCTEST_X"}
	want := "skip: no a cluster: IDEM_SVCTEST_X is not set (it has no standard address)"
	if _, ended := need(t, s); ended != want {
		t.Fatalf("got %q, want %q", ended, want)
	}
}

func TestSummaryLineCountsSkipsByReason(t *testing.T) {
	s := &skips{n: map[string]int{}}
	if got := s.line("./x"); got != "" {
		t.Fatalf("nothing skipped: %q, want no line", got)
	}
	s.add("no B")
	s.add("no A")
	s.add("no B")
	if got, want := s.line("./x"), "svctest: ./x: 3 tests skipped (1: no A; 2: no B)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

func TestSkipUnlessLong(t *testing.T) {
	for _, tc := range []struct{ long, want string }{
		{"", "skip: long: the sweep runs with IDEM_LONG=1 (.ci/run sets it)"},
		{"1", ""},
	} {
		t.Setenv(LongEnv, tc.long)
		r := &recorder{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			SkipUnlessLong(r, "the sweep")
		}()
		<-done
		if r.ended != tc.want {
			t.Errorf("IDEM_LONG=%q: %q, want %q", tc.long, r.ended, tc.want)
		}
	}
}

func TestSummaryLineSaysOneTestInTheSingular(t *testing.T) {
	s := &skips{n: map[string]int{}}
	s.add("no A")
	if got, want := s.line("./x"), "svctest: ./x: 1 test skipped (1: no A)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
