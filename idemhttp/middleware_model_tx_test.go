package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/mysql"
	"github.com/seed094d4201/idem/postgres"
	"github.com/seed094d4201/idem/sqlite"
	"pgregory.net/rapid"
)

// TestMiddlewareModelInTx drives the model of TestMiddlewareModel through
// guards in the transactional mode (Options.InTx), over SQLite (a file of
// the test's own), and PostgreSQL and MySQL where they run: the same random
// plans (every status, headers, bodies around MaxStoredBody, Flush, Hijack,
// panics, duplicates waiting on a run in flight or giving up, another
// payload, a client hanging up while its handler runs), each handler also
// inserting a row of its request through the transaction. Besides the
// answers, which follow the transactional contract (a streamed, hijacked
// or too large response is refused with 500; a panic or an unremembered
// status rolls back; the rest commits), it checks after every step that
//
//   - a key has a committed row if and only if its response is recorded,
//     and that row is the remembered run's;
//   - a key never has two rows;
//   - a key whose runs were all refused or rolled back has no row and no
//     record: it is free, and its retry runs the handler afresh;
//   - no claim is ever seen outside its transaction;
//   - a recorded key's retries get its first answer, byte for byte.
//
// Seeded and budgeted as TestMiddlewareModel.
func TestMiddlewareModelInTx(t *testing.T) {
	seed := seedRapid(t)
	t.Logf("seed %d (run again with -rapid.seed=%d)", seed, seed)
	budget := 2 * time.Second
	if svctest.Long() {
		budget = time.Minute
		moreChecks(t)
	}
	for _, db := range txModels {
		t.Run(db.name, func(t *testing.T) {
			tx, newStore := db.open(t)
			runMiddlewareModel(t, budget, newStore, tx)
		})
	}
}

// A txModel is the database the transactional model's guards run in: its
// InTx, the store's Backend, and the rows its handler writes.
type txModel struct {
	inTx      func(ctx context.Context, store *idem.Store[idemhttp.Response], key string, payload any, fn func(ctx context.Context) (idemhttp.Response, error)) (idemhttp.Response, error)
	backend   backend.Backend
	insert    func(ctx context.Context, key, id string) error // through the transaction in ctx
	rows      func(key string) ([]string, error)              // the committed rows' request ids
	oneWriter bool                                            // a transaction holds the whole database's writes (SQLite)
}

// modelTable is a table name of the test's own.
func modelTable(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

var txModels = []struct {
	name string
	open func(t *testing.T) (*txModel, func() *idem.Store[idemhttp.Response])
}{
	{"sqlite", func(t *testing.T) (*txModel, func() *idem.Store[idemhttp.Response]) {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "model.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b, err := sqlite.New(context.Background(), db, sqlite.Options{})
		if err == nil {
			_, err = db.Exec(`CREATE TABLE model_rows (idem_key TEXT NOT NULL, req TEXT NOT NULL)`)
		}
		if err != nil {
			t.Fatal(err)
		}
		return &txModel{
			inTx: sqlite.InTx[idemhttp.Response], backend: b, oneWriter: true,
			insert: func(ctx context.Context, key, id string) error {
				tx, ok := sqlite.TxFromContext(ctx)
				if !ok {
					return fmt.Errorf("no transaction in the handler's request")
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO model_rows (idem_key, req) VALUES (?, ?)`, key, id)
				return err
			},
			rows: func(key string) ([]string, error) {
				return sqlRows(db, `SELECT req FROM model_rows WHERE idem_key = ?`, key)
			},
		}, storeOn(b)
	}},
	{"postgres", func(t *testing.T) (*txModel, func() *idem.Store[idemhttp.Response]) {
		pool, err := pgxpool.New(context.Background(), svctest.Postgres(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		keys, rows := modelTable("idem_model_keys_"), modelTable("idem_model_rows_")
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+keys+", "+rows) })
		b, err := postgres.New(context.Background(), pool, postgres.Options{Table: keys})
		if err == nil {
			_, err = pool.Exec(context.Background(), "CREATE TABLE "+rows+" (idem_key TEXT NOT NULL, req TEXT NOT NULL)")
		}
		if err != nil {
			t.Fatal(err)
		}
		return &txModel{
			inTx: postgres.InTx[idemhttp.Response], backend: b,
			insert: func(ctx context.Context, key, id string) error {
				tx, ok := postgres.TxFromContext(ctx)
				if !ok {
					return fmt.Errorf("no transaction in the handler's request")
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+rows+" (idem_key, req) VALUES ($1, $2)", key, id)
				return err
			},
			rows: func(key string) ([]string, error) {
				got, err := pool.Query(context.Background(), "SELECT req FROM "+rows+" WHERE idem_key = $1", key)
				if err != nil {
					return nil, err
				}
				defer got.Close()
				var ids []string
				for got.Next() {
					var id string
					if err := got.Scan(&id); err != nil {
						return nil, err
					}
					ids = append(ids, id)
				}
				return ids, got.Err()
			},
		}, storeOn(b)
	}},
	{"mysql", func(t *testing.T) (*txModel, func() *idem.Store[idemhttp.Response]) {
		db, err := sql.Open("mysql", svctest.MySQL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		keys, rows := modelTable("idem_model_keys_"), modelTable("idem_model_rows_")
		t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + keys + ", " + rows) })
		b, err := mysql.New(context.Background(), db, mysql.Options{Table: keys})
		if err == nil {
			_, err = db.Exec("CREATE TABLE " + rows + " (idem_key VARCHAR(128) NOT NULL, req VARCHAR(128) NOT NULL) ENGINE=InnoDB")
		}
		if err != nil {
			t.Fatal(err)
		}
		return &txModel{
			inTx: mysql.InTx[idemhttp.Response], backend: b,
			insert: func(ctx context.Context, key, id string) error {
				tx, ok := mysql.TxFromContext(ctx)
				if !ok {
					return fmt.Errorf("no transaction in the handler's request")
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO "+rows+" (idem_key, req) VALUES (?, ?)", key, id)
				return err
			},
			rows: func(key string) ([]string, error) {
				return sqlRows(db, "SELECT req FROM "+rows+" WHERE idem_key = ?", key)
			},
		}, storeOn(b)
	}},
}

// storeOn makes the model's stores, one a sequence, over b.
func storeOn(b backend.Backend) func() *idem.Store[idemhttp.Response] {
	return func() *idem.Store[idemhttp.Response] {
		return idem.New[idemhttp.Response](idem.Options{Backend: b})
	}
}

// sqlRows returns the one column of query's rows.
func sqlRows(db *sql.DB, query string, args ...any) ([]string, error) {
	got, err := db.Query(query, args...)
	if err != nil {
		return nil, err
	}
	defer got.Close()
	var ids []string
	for got.Next() {
		var id string
		if err := got.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, got.Err()
}

// refusedInTx reports whether the transactional mode refuses a run of p:
// its response cannot be held until its transaction commits.
func refusedInTx(p plan) bool {
	return p.Flush || p.Hijack != noHijack || p.Body > modelMaxBody
}

// expectTx is expect in the transactional mode: a run of p that panics or
// is refused keeps nothing, nor does one with an unremembered status; the
// rest is remembered whole.
func expectTx(p plan, id string) (resp idemhttp.Response, remembered, complete bool) {
	if p.Panic != noPanic || refusedInTx(p) {
		return idemhttp.Response{}, false, false
	}
	resp, remembered, complete = expect(p, id)
	return resp, remembered, complete
}

// expect is the model's expectation of a run of p in its guards' mode.
func (m *modelServer) expect(p plan, id string) (idemhttp.Response, bool, bool) {
	if m.tx != nil {
		return expectTx(p, id)
	}
	return expect(p, id)
}

// waitedOnRefusedTx reports whether got is an answer the transactional
// mode gives a duplicate that waited on a run of p it refused: a 503 with
// Retry-After, the key being free again.
func waitedOnRefusedTx(p plan, got int, problem bool) bool {
	return refusedInTx(p) && p.Panic == noPanic && got == http.StatusServiceUnavailable && problem
}

// insertRow writes request id's row for key through the transaction in
// ctx, as a handler in the transactional mode does.
func (m *modelServer) insertRow(ctx context.Context, key, id string) {
	if err := m.tx.insert(ctx, key, id); err != nil {
		m.mu.Lock()
		m.fail("request %s (key %s): inserting its row through the request's transaction: %v", id, key, err)
		m.mu.Unlock()
	}
}

// hijack answers on the taken-over connection, or, in the transactional
// mode, checks that taking it over is refused.
func (m *modelServer) hijack(w http.ResponseWriter, answer string) {
	if m.tx == nil {
		hijackAnswer(w, answer)
		return
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
		m.mu.Lock()
		m.fail("a Hijack in the transactional mode was not refused")
		m.mu.Unlock()
	}
}

// serve is h, noting when the guard has answered each request, its
// transaction committed or rolled back.
func (m *modelServer) serve(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if ch := m.served[r.Header.Get("X-Req")]; ch != nil {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// checkOwnTx checks the answer of a request whose handler ran in the
// transactional mode: its own response once committed or rolled back as
// a response not remembered, 500 if it panicked or was refused.
func (m *modelServer) checkOwnTx(rt *rapid.T, c *call) {
	p := c.plan
	if c.hungUp {
		return
	}
	if c.err != nil {
		rt.Fatalf("request %s (%v): %v", c.id, p, c.err)
	}
	if p.Panic != noPanic || refusedInTx(p) {
		if c.resp.StatusCode != http.StatusInternalServerError || !strings.HasPrefix(c.resp.Header.Get("Content-Type"), "application/problem+json") {
			rt.Fatalf("request %s (%v): its handler panicked or its response could not be held: got %d %q, want a 500 problem", c.id, p, c.resp.StatusCode, c.body)
		}
		return
	}
	want, _, _ := expectTx(p, c.id)
	if diff := ownDiff(c, want); diff != "" {
		rt.Fatalf("request %s (%v): %s", c.id, p, diff)
	}
	m.first[c.id] = c
}

// checkFirstAnswer checks that c, a replay of request id's run, is the
// answer id's own client got, byte for byte: status, the stored headers,
// the body. Called with m.mu held.
func (m *modelServer) checkFirstAnswer(rt *rapid.T, c *call, id string) {
	f := m.first[id]
	if f == nil {
		return // its client hung up: the model's expectation stands in for it
	}
	switch {
	case c.resp.StatusCode != f.resp.StatusCode:
		rt.Fatalf("request %s replays request %s's run with %d; its client got %d", c.id, id, c.resp.StatusCode, f.resp.StatusCode)
	case !bytes.Equal(c.body, f.body):
		rt.Fatalf("request %s replays request %s's run with body %q; its client got %q", c.id, id, c.body, f.body)
	}
	for _, name := range []string{"Location", "X-Model", "Content-Type"} {
		if got, want := c.resp.Header.Values(name), f.resp.Header.Values(name); strings.Join(got, ",") != strings.Join(want, ",") {
			rt.Fatalf("request %s replays request %s's run with %s %q; its client got %q", c.id, id, name, got, want)
		}
	}
}

// ownDiff says how c's answer differs from its handler's own response
// want, or "".
func ownDiff(c *call, want idemhttp.Response) string {
	var diffs []string
	if c.resp.StatusCode != want.Status || string(c.body) != string(want.Body) {
		diffs = append(diffs, fmt.Sprintf("got %d with %d bytes, want its handler's %d with %d", c.resp.StatusCode, len(c.body), want.Status, len(want.Body)))
	}
	for _, name := range []string{"Location", "X-Model", "Content-Type"} {
		if w := want.Header.Get(name); w != "" && c.resp.Header.Get(name) != w {
			diffs = append(diffs, fmt.Sprintf("%s %q, want %q", name, c.resp.Header.Get(name), w))
		}
	}
	if want.Header != nil && c.resp.Header.Get("Set-Cookie") != "s="+c.id {
		diffs = append(diffs, "its handler's own answer lost its Set-Cookie")
	}
	return strings.Join(diffs, "; ")
}

// checkRows checks every key's rows against its record and the model: a
// row committed if and only if the key's response is recorded, the
// remembered run's, never two; no record but a completed one.
func (m *modelServer) checkRows(rt *rapid.T) {
	type keyState struct {
		key  string
		done *run
		runs string
	}
	m.mu.Lock()
	var keys []keyState
	for key, k := range m.keys {
		keys = append(keys, keyState{key, k.done, runsOf(k)})
	}
	m.mu.Unlock()
	for _, k := range keys {
		key := k.key
		ids, err := m.tx.rows(key)
		if err != nil {
			rt.Fatalf("key %s: reading its rows: %v", key, err)
		}
		rec, found, err := m.tx.backend.Get(context.Background(), idemhttp.StoreKey("", key), time.Now())
		if err != nil {
			rt.Fatalf("key %s: reading its record: %v", key, err)
		}
		recorded := found && rec.State == backend.StateCompleted
		switch {
		case len(ids) > 1:
			rt.Fatalf("key %s has %d rows (requests %v): one key, one run's rows", key, len(ids), ids)
		case found && !recorded:
			rt.Fatalf("key %s: a record in state %v is seen outside its transaction", key, rec.State)
		case recorded != (len(ids) == 1):
			rt.Fatalf("key %s: recorded %v, but %d committed rows (%v): the rows commit with the response or not at all", key, recorded, len(ids), ids)
		case k.done == nil && recorded:
			rt.Fatalf("key %s: recorded (row of %v), but no run of it is one the contract remembers (runs %s)", key, ids, k.runs)
		case k.done != nil && !recorded:
			rt.Fatalf("key %s: request %s's run (%v) is remembered, but the key has no record nor row", key, k.done.id, k.done.plan)
		case k.done != nil && ids[0] != k.done.id:
			rt.Fatalf("key %s: the row is request %s's, but the remembered run is request %s's", key, ids[0], k.done.id)
		}
	}
}

func runsOf(k *keyModel) string {
	var s []string
	for _, r := range k.runs {
		s = append(s, fmt.Sprintf("%s %v", r.id, r.plan))
	}
	return strings.Join(s, "; ")
}
