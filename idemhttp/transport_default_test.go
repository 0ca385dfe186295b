package idemhttp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// By default the Transport keeps retrying for at least 3.75 seconds, long
// enough to outlive a rolling deploy's restart or a database failover,
// which take seconds (Stripe's SDKs wait from 0.5 s up to 5 s, the AWS
// SDKs' standard retryer up to 20 s): the old default gave up within
// 700 ms. The waits are jittered, so the shortest of many draws is taken.
func TestTransportDefaultRetriesOutliveADeploy(t *testing.T) {
	var tr Transport
	assert.Equal(t, 5, tr.maxAttempts())
	shortest, longest := time.Duration(1<<62), time.Duration(0)
	for range 200 {
		var window time.Duration
		for attempt := 1; attempt < tr.maxAttempts(); attempt++ {
			window += tr.backoff(attempt, nil)
		}
		shortest, longest = min(shortest, window), max(longest, window)
	}
	assert.GreaterOrEqual(t, shortest, 3750*time.Millisecond)
	assert.LessOrEqual(t, longest, 7500*time.Millisecond)
}
