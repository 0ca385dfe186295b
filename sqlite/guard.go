package sqlite

import (
	"database/sql"
	"sync/atomic"

	modernc "modernc.org/sqlite"
)

// A commitGuard vetoes every commit on one connection but the one
// RunOnceTx makes itself. SQLite ends a transaction by itself on some
// errors (a trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, a full disk, an
// interrupt); every statement fn then sends through tx runs in autocommit
// mode and would commit on its own, without the key, once per retry. And
// fn must not commit tx itself. The guard turns those commits into
// rollbacks. It needs a driver that can set a commit hook
// (modernc.org/sqlite); with another, it guards nothing.
type commitGuard struct {
	conn  *sql.Conn
	allow atomic.Bool // set just before RunOnceTx's own COMMIT
	set   bool        // whether the hook was set
}

// hooker is the driver connection that can set a commit hook.
type hooker interface {
	RegisterCommitHook(modernc.CommitHookFn)
}

func guardCommits(conn *sql.Conn) *commitGuard {
	g := &commitGuard{conn: conn}
	_ = conn.Raw(func(dc any) error {
		if h, ok := dc.(hooker); ok {
			h.RegisterCommitHook(func() int32 {
				if g.allow.Load() {
					return 0
				}
				return 1 // non-zero: the commit becomes a rollback
			})
			g.set = true
		}
		return nil
	})
	return g
}

// remove takes the hook off, before the connection goes back to the pool.
func (g *commitGuard) remove() {
	if !g.set {
		return
	}
	_ = g.conn.Raw(func(dc any) error {
		dc.(hooker).RegisterCommitHook(nil)
		return nil
	})
}
