package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(orderServiceEnv); path != "" { // this binary as the order service
		if err := orderService(path, os.Getenv(paymentsEnv), os.Getenv(killEnv) != "", os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "order service:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out))
	assert.Equal(t, `The order service places order 101: three steps, each recorded as it finishes.
  create-order: order 101 created
  the order service is killed (SIGKILL) after the charge, before it recorded it
  the client retries order 101, and the order service resumes it:
  create-order: order 101 created (recorded, not run again)
  charge: the payment service answered with its first charge (charge 1, 450 rupees; Idempotent-Replayed)
  notify: customer notified
The customer was charged 1 time(s), 450 rupees in all; no operator was needed.
`, out.String())
}
