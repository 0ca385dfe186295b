package idemqueue

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
	modernc "modernc.org/sqlite"
)

// Issue 24: with 16 messages in flight, idem costs at most one local
// commit a message. A message is two durable writes, its claim and its
// outcome; the embedded backends' group commit lets the writes of the
// messages in flight share commits. The commits are counted where they
// happen, not inferred: bbolt's transaction id, which every committed
// write transaction raises by one, and SQLite's commit hook on every
// connection to the file. The adapters' tests count the same through a
// real broker.

const (
	inFlight = 16
	messages = 1000
)

// consumeAll hands n new messages to workers goroutines that each take
// the next one as soon as theirs is decided, as a broker with that many
// unacked messages does, and checks each is acked.
func consumeAll(t *testing.T, c *Consumer[int], n, workers int) {
	t.Helper()
	ids := make(chan string, n)
	for i := range n {
		ids <- fmt.Sprintf("msg-%d-%04d", workers, i)
	}
	close(ids)
	var acked atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for id := range ids {
				d := c.Handle(context.Background(), id, "body of "+id, func(context.Context) (int, error) { return len(id), nil })
				if d.Action == Ack {
					acked.Add(1)
				} else {
					t.Errorf("%s: %v: %v", id, d.Action, d.Err)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(n), acked.Load())
}

// assertCommitsPerMessage checks commits against the bound and
// logs the figure.
func assertCommitsPerMessage(t *testing.T, commits int64, n int) {
	t.Helper()
	t.Logf("%d commits for %d messages, %d in flight: %.3f a message", commits, n, inFlight, float64(commits)/float64(n))
	assert.LessOrEqual(t, commits, int64(n), "more than one commit a message")
	// Each message in flight waits for one write at a time, so no
	// commit holds more than inFlight writes.
	assert.GreaterOrEqual(t, commits, int64(2*n/inFlight), "fewer commits than the writes need: the count misses some")
}

func newConsumer(t *testing.T, b backend.Backend) *Consumer[int] {
	t.Helper()
	s := idem.New[int](idem.Options{Backend: b})
	t.Cleanup(func() { s.Close() })
	c, err := New(s, Options{})
	require.NoError(t, err)
	return c
}

// countedCommits runs messages through c, first one at a time, when each
// of a message's two writes is a commit of its own (which shows the count
// sees every commit), then inFlight at a time, and returns the commits of
// the second run.
func countedCommits(t *testing.T, c *Consumer[int], commits func() int64) int64 {
	t.Helper()
	const alone = 50
	before := commits()
	consumeAll(t, c, alone, 1)
	require.Equal(t, int64(2*alone), commits()-before, "commits for %d messages one at a time", alone)
	before = commits()
	consumeAll(t, c, messages, inFlight)
	return commits() - before
}

// boltTxID is the id of the last write transaction committed to b's file:
// a read transaction sees the meta of that commit.
func boltTxID(t *testing.T, b *bolt.Backend) int64 {
	t.Helper()
	var id int
	require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error { id = tx.ID(); return nil }))
	return int64(id)
}

func TestAtMostOneCommitPerMessageOnBolt(t *testing.T) {
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	commits := countedCommits(t, newConsumer(t, b), func() int64 { return boltTxID(t, b) })
	assertCommitsPerMessage(t, commits, messages)
}

// sqliteCommits counts the commits on every connection the driver opens
// to the file at path from now on. A connection hook cannot be taken
// back, so it counts only that file's, by its DSN.
func sqliteCommits(path string) *atomic.Int64 {
	var n atomic.Int64
	modernc.RegisterConnectionHook(func(conn modernc.ExecQuerierContext, dsn string) error {
		if strings.HasPrefix(dsn, "file:"+path+"?") {
			conn.(interface {
				RegisterCommitHook(modernc.CommitHookFn)
			}).RegisterCommitHook(func() int32 { n.Add(1); return 0 })
		}
		return nil
	})
	return &n
}

func TestAtMostOneCommitPerMessageOnSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.sqlite")
	commits := sqliteCommits(path)
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b, err := sqlite.New(context.Background(), db, sqlite.Options{})
	require.NoError(t, err)
	assertCommitsPerMessage(t, countedCommits(t, newConsumer(t, b), commits.Load), messages)
}
