package mysql

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The statements of a new key and of a replay (the claim's insert, its
// RETURNING form, the read of a record it met, and Complete) are sent as server-side prepared
// statements: the server parses and plans each once per connection, not
// at every call, and answers in the binary protocol, whose numbers need no
// parsing. These statements are long (the claim returns every column of
// the record, its instants computed), and parsing them cost the server
// more than the rest of their work: sent as plain queries, the claim and
// Complete took about 1.4x the time of a plain INSERT and UPDATE of the
// same keys at 16 callers; prepared, about the same time as those.
// Prepared, they also do not depend on the DSN's interpolateParams.
//
// Every other statement (rare: a takeover, a release, a renewal, Forget,
// the sweep, a listing, RunOnceTx's, whose session fn may have changed)
// is sent as a plain query.

// Indexes of the prepared statements.
const (
	prepClaim = iota
	prepInsert
	prepGet
	prepComplete
	nPrepared
)

// prepared holds a Backend's prepared statements, each made on first use:
// New prepares nothing, so that it never fails for them (a NoMigrate table
// created later, a server that refuses to prepare one).
type prepared struct {
	db    *sql.DB
	slots [nPrepared]prepSlot
}

type prepSlot struct {
	query string
	stmt  atomic.Pointer[sql.Stmt]
	// notBefore is when to try preparing again after the server refused
	// (max_prepared_stmt_count reached, a table not there yet, a proxy
	// that does not prepare), in Unix nanoseconds: meanwhile the statement
	// goes as a plain query, without a failed prepare each call.
	notBefore atomic.Int64
}

// prepareRetry is how long a statement the server refused to prepare is
// sent as a plain query before the backend asks again.
const prepareRetry = time.Minute

func newPrepared(db *sql.DB, q queries) *prepared {
	p := &prepared{db: db}
	p.slots[prepClaim].query = q.claim
	p.slots[prepInsert].query = q.insert
	p.slots[prepGet].query = q.get
	p.slots[prepComplete].query = q.complete
	return p
}

// releaseWith closes p's statements on the server (on every connection
// they were prepared on) once owner is unreachable: a Backend has no
// Close, and a server holds at most max_prepared_stmt_count of them for
// all its clients.
func (p *prepared) releaseWith(owner *Backend) {
	runtime.AddCleanup(owner, func(p *prepared) { p.close() }, p)
}

func (p *prepared) close() {
	for i := range p.slots {
		if s := p.slots[i].stmt.Swap(nil); s != nil {
			_ = s.Close()
		}
	}
}

// stmt returns query's prepared statement, preparing it if need be, or
// nil: query is not one p prepares, or the server refused it lately, or
// preparing it failed (the caller then sends query as a plain query,
// which fails the same way if the server or ctx is the cause).
func (p *prepared) stmt(ctx context.Context, query string) *sql.Stmt {
	s := p.slot(query)
	if s == nil {
		return nil
	}
	if nb := s.notBefore.Load(); nb != 0 && time.Now().UnixNano() < nb {
		return nil
	}
	if st := s.stmt.Load(); st != nil {
		return st
	}
	// No lock while preparing: a call must end when its ctx does, not
	// wait on another's prepare. Concurrent first calls may each prepare
	// one; all but the first are closed.
	st, err := p.db.PrepareContext(ctx, query)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			s.notBefore.Store(time.Now().Add(prepareRetry).UnixNano())
		}
		return nil
	}
	if !s.stmt.CompareAndSwap(nil, st) {
		_ = st.Close()
		return s.stmt.Load()
	}
	return st
}

// slot finds query's slot: the statements are long, but differ in length
// or early, so that the comparisons are cheap.
func (p *prepared) slot(query string) *prepSlot {
	for i := range p.slots {
		if s := &p.slots[i]; s.query == query {
			return s
		}
	}
	return nil
}

// unprepared reports whether err is a statement's failure to be prepared
// on a connection it had not been prepared on yet, which database/sql
// does on first use there: the server's limit of prepared statements
// (1461) or a statement it does not prepare (1295); or a statement the
// server gave up re-preparing after its table changed (1615). Nothing was
// run; the statement is sent again as a plain query, and for a while as
// one only (the statement stays open: other calls may be using it).
func (p *prepared) unprepared(query string, err error) bool {
	var me *mysql.MySQLError
	if err == nil || !errors.As(err, &me) || me.Number != 1461 && me.Number != 1295 && me.Number != 1615 {
		return false
	}
	if s := p.slot(query); s != nil {
		s.notBefore.Store(time.Now().Add(prepareRetry).UnixNano())
	}
	return true
}

// pool is the querier of the backend's own statements on its pool: the
// prepared ones by their handle, any other as a plain query.
type pool struct{ p *prepared }

func (q pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := q.p.stmt(ctx, query); st != nil {
		res, err := st.ExecContext(ctx, args...)
		if !q.p.unprepared(query, err) {
			return res, err
		}
	}
	return q.p.db.ExecContext(ctx, query, args...)
}

func (q pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := q.p.stmt(ctx, query); st != nil {
		rows, err := st.QueryContext(ctx, args...)
		if !q.p.unprepared(query, err) {
			return rows, err
		}
	}
	return q.p.db.QueryContext(ctx, query, args...)
}
