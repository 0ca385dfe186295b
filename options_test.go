package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The sweeper's default interval follows a short TTL, but never runs more
// often than once a second: a 1 ms TTL must not run a 1 kHz sweeper. An
// interval set by hand is kept as it is.
func TestSweepIntervalDefault(t *testing.T) {
	for _, tc := range []struct {
		ttl, set, want time.Duration
	}{
		{ttl: 0, want: time.Minute},
		{ttl: 10 * time.Second, want: 10 * time.Second},
		{ttl: time.Millisecond, want: time.Second},
		{ttl: time.Millisecond, set: 5 * time.Millisecond, want: 5 * time.Millisecond},
		{ttl: time.Hour, set: -1, want: -1},
	} {
		got := Options{TTL: tc.ttl, SweepInterval: tc.set}.withDefaults().SweepInterval
		assert.Equal(t, tc.want, got, "TTL %v, SweepInterval %v", tc.ttl, tc.set)
	}
}
