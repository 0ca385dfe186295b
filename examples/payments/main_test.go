package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out))
	assert.Equal(t, `Paying three orders through a network that loses the first reply:
  order 101: 201 Created, charge 1 (a retry after the lost reply, answered from the stored response)
  order 102: 201 Created, charge 2
  order 103: 201 Created, charge 3
The ledger:
  charge 1: order 101, 450 rupees
  charge 2: order 102, 990 rupees
  charge 3: order 103, 120 rupees
One charge per order: true (the proxy dropped 1 reply)
`, out.String())
}

func TestGRPCStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, runGRPC(&out))
	assert.Equal(t, `Paying three orders over gRPC; the first reply is lost:
  order 101: charge 1 (a retry after the lost reply, answered from the stored reply)
  order 102: charge 2
  order 103: charge 3
The ledger:
  charge 1: order 101, 450 rupees
  charge 2: order 102, 990 rupees
  charge 3: order 103, 120 rupees
One charge per order: true
`, out.String())
}
