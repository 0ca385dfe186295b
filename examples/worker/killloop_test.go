package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKillLoop delivers 1,000 events at least once, with duplicates, to a
// worker process that is SIGKILLed at random moments 30 times and
// restarted each time, as a broker would: an event not acked when the
// worker died is handed out again. The final stock must equal the seed
// plus the sum of the distinct events, every event must have its done
// note, and no event may be reported applied twice.
func TestKillLoop(t *testing.T) {
	for _, kind := range []string{"sqlite", "bolt", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "mysql" {
				svctest.MySQL(t) // or skip
			}
			killLoop(t, kind, 1000, 30)
		})
	}
}

func killLoop(t *testing.T, kind string, events, kills int) {
	rngSeed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", rngSeed)
	rng := rand.New(rand.NewPCG(rngSeed, rngSeed))
	evs := make([]Event, events)
	want := map[string]int{}
	for item, n := range seed {
		want[item] = n
	}
	for i := range evs {
		delta := rng.IntN(20) - 10
		if delta >= 0 {
			delta++
		}
		evs[i] = Event{ID: fmt.Sprintf("event-%04d", i), Item: fmt.Sprintf("item-%02d", rng.IntN(20)), Delta: delta}
		want[evs[i].Item] += delta
	}
	path := filepath.Join(t.TempDir(), kind+".db")
	if kind == "mysql" {
		path = fmt.Sprintf("idem_worker_kill_%d_", time.Now().UnixNano())
		t.Cleanup(func() { _ = dropMySQL(path) })
	}

	var (
		acked      = make([]bool, events)
		nAcked     int
		next       int   // the first event never delivered
		redeliver  []int // delivered, not acked: handed out again first
		killed     int   // kills that stopped the worker
		midEvent   int   // of those, kills with an event in flight
		duplicates int   // deliveries of an event already acked
		applied    = make([]int, events)
	)
	for killed < kills || nAcked < events {
		wk, err := startWorker(kind, path)
		require.NoError(t, err)
		var timer *time.Timer
		if killed < kills {
			timer = time.AfterFunc(time.Duration(rng.Int64N(int64(60*time.Millisecond))), func() { _ = wk.cmd.Process.Kill() })
		}
		gone := false
		for !gone && (killed < kills || nAcked < events) {
			var i int
			switch {
			case len(redeliver) > 0:
				i, redeliver = redeliver[0], redeliver[1:]
			case next < events && (nAcked == 0 || rng.IntN(5) > 0):
				i, next = next, next+1
			default: // a duplicate: the broker hands out an acked event again
				i = ackedAt(rng, acked)
				duplicates++
			}
			words, err := wk.deliver(evs[i])
			if err != nil {
				gone = true
				redeliver = append([]int{i}, redeliver...)
				midEvent++
				break
			}
			require.Len(t, words, 3, "worker: %v", words)
			require.Contains(t, []string{"applied", "skipped"}, words[0], "worker: %v", words)
			if words[0] == "applied" {
				applied[i]++
			}
			if !acked[i] {
				acked[i], nAcked = true, nAcked+1
			}
		}
		if timer != nil && !timer.Stop() || gone {
			_ = wk.kill()
			killed++
			continue
		}
		require.NoError(t, wk.stop())
	}
	twice := 0
	for i, n := range applied {
		if !assert.LessOrEqual(t, n, 1, "event %s was reported applied %d times", evs[i].ID, n) {
			twice++
		}
	}
	stock, err := openStock(kind, path, nil)
	require.NoError(t, err)
	defer stock.Close()
	levels, err := stock.Levels(context.Background())
	require.NoError(t, err)
	wrong := 0
	for item, n := range want {
		if levels[item] != n {
			wrong++
		}
	}
	assert.Equal(t, want, levels, "the final stock is the seed plus the sum of the distinct events")
	done, err := stock.Done(context.Background())
	require.NoError(t, err)
	assert.Equal(t, events, done, "one done note per event")

	line := fmt.Sprintf("worker kill loop (%s): %d events, %d deliveries of acked events, %d kills (%d with an event in flight); events applied twice: %d, items with a wrong stock: %d, done notes: %d",
		kind, events, duplicates, killed, midEvent, twice, wrong, done)
	t.Log(line)
	if report := os.Getenv("IDEM_KILLLOOP_REPORT"); report != "" { // .ci/run prints it
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = fmt.Fprintln(f, line)
		require.NoError(t, errors.Join(err, f.Close()))
	}
}

// ackedAt returns a random acked event.
func ackedAt(rng *rand.Rand, acked []bool) int {
	for {
		if i := rng.IntN(len(acked)); acked[i] {
			return i
		}
	}
}
