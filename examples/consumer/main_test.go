package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if kind := os.Getenv(brokerEnv); kind != "" { // this binary as a worker process
		if err := serveWorker(kind, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(svctest.M(m).Run())
}

// needBroker skips (fails, in CI) without the broker kind's address.
func needBroker(t *testing.T, kind string) {
	t.Helper()
	if kind == "nats" {
		svctest.NATS(t)
	} else {
		svctest.AMQP(t)
	}
}

func TestStory(t *testing.T) {
	for _, kind := range []string{"nats", "rabbitmq"} {
		t.Run(kind, func(t *testing.T) {
			needBroker(t, kind)
			exe, err := os.Executable()
			require.NoError(t, err)
			var out strings.Builder
			require.NoError(t, run(&out, exe, kind))
			assert.Equal(t, kind+`: 4 events published, order-101-placed twice; stock 10 dosa-mix, 10 idli-rava
  the worker is killed inside order-102-placed's transaction (SIGKILL), before its ack
  a new worker starts; the broker hands out what was not acked again
  final stock: 7 dosa-mix, 7 idli-rava (10-2-1 and 10-3): each event applied once
`, out.String())
		})
	}
}
