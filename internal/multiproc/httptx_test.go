package multiproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/require"
)

// The transactional HTTP kill loop: a server process (httptx_child_test.go)
// charges orders behind idemhttp.Middleware with InTx, each charge a row
// inserted through the request's transaction, and is SIGKILLed again and
// again, at a random instant or paused on purpose just before its commit or
// just after it (its response not sent), then restarted on the same
// database and the same listening socket. Four clients, each an
// http.Client over idemhttp.Transport, send orders (each with its one key
// and one body on every attempt; some from two callers at once) through a
// proxy that loses some replies after the server answered, and hangs up on
// the server for some requests. When the clients are done:
//
//   - every order has exactly one charge row;
//   - every order's client got, byte for byte, the answer committed with
//     its charge row (the row holds the body its run answered), and so did
//     every attempt that got a 2xx;
//   - no attempt was answered 500 (an outcome unknown, or anything else);
//   - the store holds no interrupted key (nor a pending one): a kill left
//     each key either committed whole or not at all.
const (
	httpTxClients   = 4
	httpTxDropOne   = 4                      // the proxy loses one reply in this many
	httpTxTwice     = 5                      // one order in this many is sent by two callers at once
	httpTxHangUpOne = 8                      // the proxy hangs up on the server for one request in this many
	httpTxHangUpBy  = 20 * time.Millisecond  // within this long
	httpTxMaxDelay  = 400 * time.Millisecond // the most a child works before its kill is aimed
	httpTxPauseBy   = 5 * time.Second        // a pause not reached by then: the child is killed where it is
	httpTxOrderBy   = 60 * time.Second       // an order still unanswered by then is a violation
)

func TestHTTPTxKillLoopPostgres(t *testing.T) {
	pool := testPool(t) // or skip
	name, charges := uniqueName("idem_httptx_"), uniqueName("idem_charges_")
	dropLater(t, pool, name)
	dropLater(t, pool, charges)
	httpTxKillLoop(t, "postgres", name, charges)
}

func TestHTTPTxKillLoopMySQL(t *testing.T) {
	svctest.MySQL(t)
	name, charges := uniqueName("idem_httptx_"), uniqueName("idem_charges_")
	dropMySQLLater(t, name)
	dropMySQLLater(t, charges)
	httpTxKillLoop(t, "mysql", name, charges)
}

func TestHTTPTxKillLoopSQLite(t *testing.T) {
	httpTxKillLoop(t, "sqlite", filepath.Join(t.TempDir(), "idem.db"), "charges")
}

// httpTxKills is how many times a loop kills its server: a few per pause
// point in a plain go test, more with IDEM_LONG.
func httpTxKills() int {
	if svctest.Long() && !testing.Short() {
		return 45
	}
	return 12
}

// httpTxKillLoop runs the loop against backend kind, its store under name
// and its charge rows in the table charges, and checks what it left.
func httpTxKillLoop(t *testing.T, kind, name, charges string) {
	start := time.Now()
	ctx := context.Background()
	// The tables exist before the first child, which only opens them.
	db, err := openHTTPTxDB(ctx, kind, name, charges)
	require.NoError(t, err)
	db.close()

	// One listening socket for every child: a request sent while no child
	// lives waits in its backlog for the next one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	lnFile, err := ln.(*net.TCPListener).File()
	require.NoError(t, err)
	t.Cleanup(func() { lnFile.Close() })

	proxy := &replyDropper{target: "http://" + ln.Addr().String(), fwd: freshConns()}
	t.Cleanup(proxy.fwd.CloseIdleConnections)
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	env := []string{httpTxEnv + "=" + kind, httpTxNameEnv + "=" + name, httpTxChargesEnv + "=" + charges}
	c := startHTTPTxChild(t, lnFile, env...)
	t.Cleanup(func() { // a test that ends early leaves no child behind
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	clientsCtx, endClients := context.WithCancel(ctx)
	t.Cleanup(endClients) // a test that ends early ends its clients too
	clients := &httpTxClientsRun{ctx: clientsCtx, url: front.URL, stop: make(chan struct{})}
	clients.start()

	kills := httpTxKills()
	var random, pre, post, missed int
	var paused []httpTxPause // the orders a kill caught at a pause point
	for i := range kills {
		// A random delay picks the moment of the crash (or of the pause
		// that places it); it orders nothing.
		time.Sleep(rand.N(httpTxMaxDelay))
		switch i % 3 {
		case 0:
			random++
		case 1, 2:
			where := "pre"
			if i%3 == 2 {
				where = "post"
			}
			if order, ok := c.pauseAt(t, where); ok {
				paused = append(paused, httpTxPause{where: where, order: order, pid: c.cmd.Process.Pid})
				if where == "pre" {
					pre++
				} else {
					post++
				}
			} else {
				missed++
			}
		}
		killHard(t, c.child)
		c = startHTTPTxChild(t, lnFile, env...)
	}
	close(clients.stop) // the last child serves the orders in flight to their end
	finished := make(chan struct{})
	go func() { clients.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(httpTxOrderBy + 30*time.Second):
		t.Fatalf("%s: the clients did not finish", kind)
	}
	killHard(t, c.child)

	var violations []string
	violate := func(format string, args ...any) {
		violations = append(violations, kind+": "+fmt.Sprintf(format, args...))
	}
	db, err = openHTTPTxDB(ctx, kind, name, charges)
	require.NoError(t, err)
	defer db.close()
	rows, err := db.charges(ctx)
	require.NoError(t, err)
	committed := maps.Clone(rows)
	byOrder := map[string]*httpTxOrderRun{}

	var attempts, unanswered, replays, retries, recalls, dups int
	seen := map[int]bool{} // the statuses other than 2xx logged once
	for _, o := range clients.all() {
		byOrder[o.order] = o
		attempts += len(o.attempts)
		unanswered += o.unanswered
		bodies := rows[o.order]
		switch {
		case len(bodies) != 1:
			violate("order %s has %d charge rows: %q", o.order, len(bodies), bodies)
		case len(o.errs) > 0:
			violate("order %s got no answer: %v", o.order, o.errs)
		}
		for _, f := range o.finals {
			if len(bodies) == 1 && (f.status != http.StatusCreated || f.body != bodies[0]) {
				violate("order %s was answered %d %q, its committed answer is 201 %q", o.order, f.status, f.body, bodies[0])
			}
			if f.replayed {
				replays++
			}
		}
		if o.senders > 1 {
			dups++
		}
		if len(o.attempts)+o.unanswered > 1 {
			retries++
		}
		if o.tries > o.senders {
			recalls++
		}
		for _, a := range o.attempts {
			switch {
			case a.status == http.StatusInternalServerError:
				violate("order %s: an attempt was answered 500: %q", o.order, a.body)
			case a.status/100 == 2 && len(bodies) == 1 && a.body != bodies[0]:
				violate("order %s: an attempt was answered %d %q, its committed answer is %q", o.order, a.status, a.body, bodies[0])
			case a.status/100 != 2 && !seen[a.status]:
				seen[a.status] = true
				t.Logf("%s: order %s: an attempt was answered %d %q (retried)", kind, o.order, a.status, a.body)
			}
		}
		delete(rows, o.order)
	}
	for order, bodies := range rows {
		violate("charge rows for an order no client sent, %s: %q", order, bodies)
	}
	// A run killed before its commit left nothing: its order was charged by
	// another run. One killed after its commit left its charge, and the
	// retry replayed its answer.
	for _, p := range paused {
		o := byOrder[p.order]
		if o == nil || len(committed[p.order]) != 1 {
			continue // a violation above
		}
		ran := strings.Contains(committed[p.order][0], fmt.Sprintf(`"run":"%d.`, p.pid))
		switch {
		case p.where == "pre" && ran:
			violate("order %s: its run killed before its commit (pid %d) is the one committed: %q", p.order, p.pid, committed[p.order][0])
		case p.where == "post" && !ran:
			violate("order %s: its run killed after its commit (pid %d) is not the one committed: %q", p.order, p.pid, committed[p.order][0])
		case p.where == "post" && slices.ContainsFunc(o.finals, func(f httpTxReply) bool { return !f.replayed }):
			violate("order %s: committed by a run killed before it answered, but its client got an answer that is not a replay", p.order)
		}
	}

	store := idem.New[idemhttp.Response](idem.Options{Backend: db.backend})
	defer store.Close()
	states := map[backend.RecordState]int{}
	for rec, err := range store.Records(ctx) {
		require.NoError(t, err)
		states[rec.State]++
		if rec.State != backend.StateCompleted {
			violate("key %q is left %v by the kills: each must be committed whole or not at all", rec.Key, rec.State)
		}
	}
	orders := len(clients.all())
	if n := states[backend.StateCompleted]; n != orders {
		violate("%d keys completed for %d orders", n, orders)
	}
	statuses := clients.statusCounts()

	line := fmt.Sprintf("httptx killloop %s: kills=%d (random=%d pre-commit=%d post-commit=%d pause-missed=%d) orders=%d (sent twice at once %d) attempts=%d (answered %s, unanswered %d) replies-dropped=%d hung-up=%d forward-errors=%d orders-retried=%d orders-called-again=%d final-replays=%d keys-completed=%d interrupted=%d pending=%d violations=%d time=%v",
		kind, kills, random, pre, post, missed, orders, dups, attempts+unanswered, statuses, unanswered, proxy.dropped.Load(), proxy.hungUp.Load(), proxy.lost.Load(),
		retries, recalls, replays, states[backend.StateCompleted], states[backend.StateInterrupted], states[backend.StatePending], len(violations), time.Since(start).Round(time.Millisecond))
	t.Log(line)
	fmt.Println(line)
	if report := os.Getenv("IDEM_KILLLOOP_REPORT"); report != "" {
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = fmt.Fprintln(f, line)
		require.NoError(t, errors.Join(err, f.Close()))
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("%s: and %d more violations", kind, len(violations)-i)
			break
		}
		t.Error(v)
	}
}

// An httpTxChild is a running server child, and the lines it says.
type httpTxChild struct {
	*child
	lines chan string
}

// startHTTPTxChild runs the server child on the listener lnFile (its fd 3)
// with env added, and returns once it has said "ready".
func startHTTPTxChild(t *testing.T, lnFile *os.File, env ...string) *httpTxChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{lnFile}
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	select {
	case line := <-lines:
		if line == "ready" {
			return &httpTxChild{child: &child{cmd: cmd, in: in}, lines: lines}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the server child did not get ready: %q", line)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the server child did not get ready in 30s")
	}
	return nil
}

// An httpTxPause is a run the kill caught at a pause point: where, its
// order, and the child's pid.
type httpTxPause struct {
	where, order string
	pid          int
}

// pauseAt tells the child to stop its next fresh run at where ("pre" or
// "post"), and returns the order of the run that stopped there, if one did
// within httpTxPauseBy.
func (c *httpTxChild) pauseAt(t *testing.T, where string) (string, bool) {
	t.Helper()
	_, err := io.WriteString(c.in, "pause "+where+"\n")
	require.NoError(t, err)
	timeout := time.NewTimer(httpTxPauseBy)
	defer timeout.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("the server child stopped before it paused %s", where)
			}
			if order, ok := strings.CutPrefix(line, "paused "+where+" "); ok {
				return order, true
			}
		case <-timeout.C:
			return "", false
		}
	}
}

// A replyDropper is an HTTP proxy to target that forwards each request
// whole and reads the server's whole answer, then loses one in
// httpTxDropOne: it cuts the client's connection instead, as a network
// would after the server did the work. One request in httpTxHangUpOne
// hangs up on the server within httpTxHangUpBy, as a client that gave up
// would, and is cut. A request the server never answers (it was killed)
// has its connection cut too.
type replyDropper struct {
	target                string
	fwd                   *http.Transport
	dropped, hungUp, lost atomic.Int64
}

func (p *replyDropper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		cut(w)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if rand.IntN(httpTxHangUpOne) == 0 {
		// The random instant picks where the hang-up lands; it orders nothing.
		stop := time.AfterFunc(rand.N(httpTxHangUpBy), cancel)
		defer stop.Stop()
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := p.fwd.RoundTrip(out)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	switch {
	case err != nil && ctx.Err() != nil && r.Context().Err() == nil:
		p.hungUp.Add(1)
		cut(w)
		return
	case err != nil:
		p.lost.Add(1)
		cut(w)
		return
	case rand.IntN(httpTxDropOne) == 0:
		p.dropped.Add(1)
		cut(w)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// freshConns is an http.Transport that sends every request on a
// connection of its own. net/http sends a request with an Idempotency-Key
// again by itself when a reused connection turns out closed: that would
// retry a lost reply, or a request to a killed server, out of sight of
// idemhttp.Transport and of the counts.
func freshConns() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	return tr
}

// cut closes the client's connection without an answer.
func cut(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// httpTxClientsRun is the clients of one loop: each sends orders one after
// another until stop is closed, every order with its own key and body.
type httpTxClientsRun struct {
	ctx  context.Context // ends every call at once
	url  string
	stop chan struct{}
	wg   sync.WaitGroup
	base *http.Transport // what every attempt is sent with

	mu     sync.Mutex
	orders map[string]*httpTxOrderRun // guarded by mu
}

// An httpTxOrderRun is what one order's client saw.
type httpTxOrderRun struct {
	order      string
	senders    int           // the callers sending it at once
	tries      int           // the callers' calls (each is the Transport's attempts)
	unanswered int           // attempts that got no answer (a reply lost, a server killed)
	attempts   []httpTxReply // every answer the Transport got, retried ones included
	finals     []httpTxReply // the answer each sender's last call returned
	errs       []error       // a sender with no answer within httpTxOrderBy
}

type httpTxReply struct {
	status   int
	body     string
	replayed bool
}

func (cr *httpTxClientsRun) start() {
	cr.orders = map[string]*httpTxOrderRun{}
	cr.base = freshConns()
	for i := range httpTxClients {
		cr.wg.Add(1)
		go func() {
			defer cr.wg.Done()
			cr.run(i)
		}()
	}
}

func (cr *httpTxClientsRun) run(client int) {
	for n := 0; ; n++ {
		select {
		case <-cr.stop:
			return
		default:
		}
		// One order in httpTxTwice is sent by two callers at once, as a
		// client that lost patience and a second instance of it would: the
		// second waits for the first's transaction, or runs if it rolled back.
		o := &httpTxOrderRun{order: fmt.Sprintf("c%d-%d", client, n), senders: 1}
		if n%httpTxTwice == httpTxTwice-1 {
			o.senders = 2
		}
		cr.mu.Lock()
		cr.orders[o.order] = o
		cr.mu.Unlock()
		var wg sync.WaitGroup
		for range o.senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cr.send(o, fmt.Sprintf(`{"order":%q,"amount":%d}`, o.order, 100+n))
			}()
		}
		wg.Wait()
	}
}

// send sends the order until it gets an answer the Transport does not
// retry: a call whose every attempt went unanswered is made again, with the
// same key and body, until httpTxOrderBy.
func (cr *httpTxClientsRun) send(o *httpTxOrderRun, body string) {
	client := &http.Client{Transport: &idemhttp.Transport{
		Base:        &recordingTransport{base: cr.base, o: o, mu: &cr.mu},
		MaxAttempts: 8,
		MinBackoff:  5 * time.Millisecond,
		MaxBackoff:  100 * time.Millisecond,
		MaxWait:     3 * time.Second,
	}}
	deadline := time.Now().Add(httpTxOrderBy)
	for {
		ctx, cancel := context.WithTimeout(cr.ctx, 15*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cr.url+"/charges", strings.NewReader(body))
		if err != nil {
			cancel()
			panic(err) // a constant URL and body
		}
		req.Header.Set(idemhttp.Header, "key-"+o.order)
		req.Header.Set("Content-Type", "application/json")
		cr.mu.Lock()
		o.tries++
		cr.mu.Unlock()
		resp, err := client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case rerr != nil:
				err = rerr
			case stillUnknown(resp.StatusCode): // the Transport gave up on a "try again": the client calls again
				err = fmt.Errorf("answered %d %q", resp.StatusCode, b)
			default:
				cancel()
				cr.mu.Lock()
				o.finals = append(o.finals, httpTxReply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemhttp.ReplayedHeader) == "true"})
				cr.mu.Unlock()
				return
			}
		}
		cancel()
		if time.Now().After(deadline) || cr.ctx.Err() != nil {
			cr.mu.Lock()
			o.errs = append(o.errs, err)
			cr.mu.Unlock()
			return
		}
	}
}

// stillUnknown reports whether status is one the Transport retries: an
// answer that says neither what was done nor that nothing will be.
func stillUnknown(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// all returns every order sent, once the clients are done.
func (cr *httpTxClientsRun) all() []*httpTxOrderRun {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	out := make([]*httpTxOrderRun, 0, len(cr.orders))
	for _, o := range cr.orders {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].order < out[j].order })
	return out
}

// statusCounts says how many attempts got each status, as "201:n,409:m".
func (cr *httpTxClientsRun) statusCounts() string {
	counts := map[int]int{}
	for _, o := range cr.all() {
		for _, a := range o.attempts {
			counts[a.status]++
		}
	}
	codes := make([]int, 0, len(counts))
	for c := range counts {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, counts[c]))
	}
	return strings.Join(parts, ",")
}

// A recordingTransport is the Base of a client's Transport: it reads each
// answer whole and records it for the order, before the Transport decides
// whether to retry it.
type recordingTransport struct {
	base http.RoundTripper
	o    *httpTxOrderRun
	mu   *sync.Mutex // guards o
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(r)
	if err != nil {
		rt.mu.Lock()
		rt.o.unanswered++
		rt.mu.Unlock()
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	rt.o.attempts = append(rt.o.attempts, httpTxReply{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemhttp.ReplayedHeader) == "true"})
	rt.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}
