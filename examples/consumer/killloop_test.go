package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/require"
)

// TestKillLoop publishes 1,000 events to a real broker, about 20% of them
// twice, and lets workers consume them, SIGKILLing each at a random moment,
// at least 20 times, before a last one drains the queue. With the local
// effect (the stock change in sqlite.RunOnceTx), the final stock must be
// the seed plus each event's change once; with the remote effect (a charge
// at a payments service that honours the step key), each event must be
// charged once and every key a killed worker left interrupted reconciled
// by the hook. In both, every event replays after the kills, and the
// broker holds nothing unacked.
func TestKillLoop(t *testing.T) {
	for _, kind := range []string{"nats", "rabbitmq"} {
		for _, remote := range []bool{false, true} {
			name := kind + "/local"
			if remote {
				name = kind + "/remote"
			}
			t.Run(name, func(t *testing.T) {
				needBroker(t, kind)
				consumerKillLoop(t, kind, remote, 1000, 20)
			})
		}
	}
}

func consumerKillLoop(t *testing.T, kind string, remote bool, events, kills int) {
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := openBroker(kind)
	require.NoError(t, err)
	defer b.close()
	db := filepath.Join(t.TempDir(), "stock.db")
	require.NoError(t, seedStock(db))
	var extra []string
	var svc *paymentsService
	if remote {
		svc = newPaymentsService()
		srv := httptest.NewServer(svc)
		defer srv.Close()
		extra = append(extra, serviceEnv+"="+srv.URL)
	}

	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	want := map[string]int{"dosa-mix": 10, "idli-rava": 10}
	ids := make([]string, events)
	bodies := map[string]string{}
	var again []string
	for i := range ids {
		ids[i] = fmt.Sprintf("event-%04d", i)
		item, delta := fmt.Sprintf("item-%02d", rng.IntN(20)), rng.IntN(19)-9
		bodies[ids[i]] = fmt.Sprintf("%s %d", item, delta)
		want[item] += delta
		require.NoError(t, b.publish(ids[i], []byte(bodies[ids[i]])))
		if rng.IntN(5) == 0 {
			again = append(again, ids[i])
		}
	}
	for _, id := range again { // the publisher sent these twice
		require.NoError(t, b.publish(id, []byte(bodies[id])))
	}

	tl := newTally()
	for range kills {
		p, err := startWorker(exe, kind, b, db, tl, extra...)
		require.NoError(t, err)
		// A random moment to die: it orders nothing.
		time.Sleep(20*time.Millisecond + rand.N(300*time.Millisecond))
		p.kill()
	}
	for round := 0; ; round++ {
		require.Less(t, round, 5, "the broker still holds messages after %d last workers", round)
		p, err := startWorker(exe, kind, b, db, tl, extra...)
		require.NoError(t, err)
		err = drain(b, db, ids, 2*time.Minute)
		p.kill()
		require.NoError(t, err)
		if done, err := b.settled(); err == nil && done { // and nothing came back with the kill
			break
		}
	}

	var violations []string
	violate := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	replayed := verifyReplays(t, db, bodies, violate)
	effects := 0
	if remote {
		for _, id := range ids {
			switch n := svc.charges(id); {
			case n == 1:
				effects++
			default:
				violate("%s charged %d times", id, n)
			}
		}
	} else {
		dbh, err := sqlite.Open(db)
		require.NoError(t, err)
		defer dbh.Close()
		for item, n := range want {
			var got int
			err := dbh.QueryRow(`SELECT count FROM stock WHERE item = ?`, item).Scan(&got)
			if errors.Is(err, context.Canceled) || (err != nil && n != 0) {
				violate("%s: %v", item, err)
			} else if got != n {
				violate("%s: stock %d, want %d (each event once)", item, got, n)
			}
		}
		effects = replayed
	}
	tl.mu.Lock()
	acks := 0
	for _, n := range tl.acked {
		acks += n
	}
	reconciled := tl.others["reconciled true"] + tl.others["reconciled false"]
	tl.mu.Unlock()
	mode := map[bool]string{false: "local", true: "remote"}[remote]
	line := fmt.Sprintf("killloop consumer %s %s: kills=%d events=%d published-twice=%d acks-said=%d rejects=%d reconciled=%d effects-once=%d replayed-after=%d unacked-after=0 violations=%d",
		kind, mode, kills, events, len(again), acks, tl.rejects, reconciled, effects, replayed, len(violations))
	t.Log(line)
	if report := os.Getenv("IDEM_KILLLOOP_REPORT"); report != "" {
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = fmt.Fprintln(f, line)
		require.NoError(t, errors.Join(err, f.Close()))
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
}

// verifyReplays opens the workers' store and runs every event again with
// an fn that must not be called: each must replay.
func verifyReplays(t *testing.T, db string, bodies map[string]string, violate func(string, ...any)) int {
	t.Helper()
	dbh, err := sqlite.Open(db)
	require.NoError(t, err)
	defer dbh.Close()
	b, err := sqlite.New(context.Background(), dbh, sqlite.Options{})
	require.NoError(t, err)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	n := 0
	for id, body := range bodies {
		_, err := s.RunOnce(context.Background(), id, []byte(body), func(context.Context) (int, error) {
			violate("%s ran again after the kills", id)
			return 0, nil
		})
		if err != nil {
			violate("%s does not replay after the kills: %v", id, err)
			continue
		}
		n++
	}
	return n
}

// paymentsService is the payments service of the remote effect: a charge
// under a step key it has seen answers that charge, and makes no other.
type paymentsService struct {
	mu      sync.Mutex
	byStep  map[string]int // step key -> charge ID
	byEvent map[string]int // event -> charge ID
	count   map[string]int // event -> charges made
}

func newPaymentsService() *paymentsService {
	return &paymentsService{byStep: map[string]int{}, byEvent: map[string]int{}, count: map[string]int{}}
}

func (p *paymentsService) charges(event string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count[event]
}

func (p *paymentsService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	event := r.URL.Query().Get("event")
	if r.Method == http.MethodGet {
		id, ok := p.byEvent[event]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, id)
		return
	}
	step := r.URL.Query().Get("step")
	if step == "" {
		http.Error(w, "no step key", http.StatusBadRequest)
		return
	}
	id, ok := p.byStep[step]
	if !ok {
		id = len(p.byStep) + 1
		p.byStep[step] = id
		p.byEvent[event] = id
		p.count[event]++
	}
	fmt.Fprintln(w, strconv.Itoa(id))
}
