package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStory(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out))
	assert.Equal(t, `Order 101, without an idempotency key:
  try 1: no reply. Did it go through? Trying again.
  reply: charge 2, order 101, 450 rupees
  order 101 was charged 2 time(s), 900 rupees in all

Order 101, with a key made once with the order:
  try 1: no reply. Did it go through? Trying again.
  reply: charge 1, order 101, 450 rupees
  order 101 was charged 1 time(s), 450 rupees in all

Five taps on Pay at once, one key:
  5 replies, 5 of them charge 1, order 101, 450 rupees
  order 101 was charged 1 time(s), 450 rupees in all

The same key sent again with order 102:
  refused: idem: key reused with a different payload
  order 102 was charged 0 time(s), 0 rupees in all

Order 101, and the service restarts before the retry (keys in a bbolt file):
  the payment service restarts: its store and file are closed and reopened
  try 1: no reply. Did it go through? Trying again.
  reply: charge 1, order 101, 450 rupees
  order 101 was charged 1 time(s), 450 rupees in all
`, out.String())
}
