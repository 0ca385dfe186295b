// Package svctest decides what a test does when the service it needs
// (PostgreSQL, Redis) is not configured, or not usable as configured: on a
// developer's machine it skips with the reason; in CI it fails, since a
// skipped test there would pass without having run.
package svctest

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// Skipf skips t with the reason the format gives, or fails t with it when
// the CI environment variable is true (as CI services and .ci/run set it).
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if inCI() {
		t.Fatalf("%s (CI is set: there a test that needs a service fails instead of skipping)", why)
	}
	t.Skip(why)
}

// inCI reports whether the tests run in CI: the CI environment variable
// holds a true value ("true", "1", ...).
func inCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}
