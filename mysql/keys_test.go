package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys are bytes: pairs that the server's default collation
// (utf8mb4_general_ci, PAD SPACE) compares equal stay distinct keys, each
// with its own outcome. Scope-joined keys, as idemhttp builds them, too.
func TestKeysDifferingInCaseOrTrailingSpaceAreDistinct(t *testing.T) {
	db := testDB(t)
	var collation string
	require.NoError(t, db.QueryRow(`SELECT @@collation_database`).Scan(&collation))
	t.Logf("database collation: %s", collation)
	b, _ := testBackend(t, db)
	s := idem.New[string](idem.Options{Backend: b})
	defer s.Close()
	ctx := context.Background()
	pairs := [][2]string{
		{"Order-1", "order-1"},
		{"a", "a "},
		{"Ключ", "ключ"},
		{"straße", "strasse"},
		{"é", "e\u0301"},
		{"tenant/Order-9", "tenant/order-9"},
	}
	for _, pair := range pairs {
		for _, key := range pair {
			v, err := s.RunOnce(ctx, key, "p", func(context.Context) (string, error) { return key, nil })
			require.NoError(t, err, "%q", key)
			assert.Equal(t, key, v, "%q ran on its own, not replayed from its pair", key)
		}
		for _, key := range pair {
			rec, found, err := b.Get(ctx, key, time.Time{})
			require.NoError(t, err)
			require.True(t, found, "%q", key)
			assert.Equal(t, key, rec.Key, "the key comes back byte for byte")
		}
	}
	var keys []string
	require.NoError(t, b.Each(ctx, func(r backend.Record) error { keys = append(keys, r.Key); return nil }))
	assert.Len(t, keys, 2*len(pairs))
}

// A session whose time_zone is another changes no instant: leases and
// expiry are UTC_TIMESTAMP(6)'s, and come back as the same instants.
func TestSessionTimeZoneChangesNoExpiry(t *testing.T) {
	utc := testDB(t)
	b, table := testBackend(t, utc)
	for _, zone := range []string{"'+05:00'", "'-11:00'", "'SYSTEM'"} {
		t.Run(zone, func(t *testing.T) {
			zoned := testDB(t, "time_zone="+url.QueryEscape(zone), "parseTime=true", "loc=Local")
			var got string
			require.NoError(t, zoned.QueryRow(`SELECT @@session.time_zone`).Scan(&got))
			require.Equal(t, strings.Trim(zone, "'"), got)
			zb, err := New(context.Background(), zoned, Options{Table: table, NoMigrate: true})
			require.NoError(t, err)
			ctx := context.Background()
			key := "tz" + zone
			claim := backend.Record{Key: key, Token: "t" + zone}
			rec, won, err := zb.Claim(ctx, claim, time.Time{}, time.Minute)
			require.NoError(t, err)
			require.True(t, won)
			assert.WithinDuration(t, time.Now(), rec.CreatedAt, 5*time.Second, "claimed now, not hours away")
			assert.WithinDuration(t, time.Now().Add(time.Minute), rec.LeaseUntil, 5*time.Second)
			require.NoError(t, zb.Complete(ctx, claim, time.Time{}, time.Hour))

			for name, reader := range map[string]*Backend{"zoned": zb, "utc": b} {
				got, ok, err := reader.Get(ctx, key, time.Time{})
				require.NoError(t, err)
				require.True(t, ok, "%s: the outcome is not expired", name)
				assert.WithinDuration(t, time.Now().Add(time.Hour), got.ExpiresAt, 5*time.Second, "%s: expires in an hour", name)
			}
			n, err := zb.Sweep(ctx, time.Time{}, 100)
			require.NoError(t, err)
			assert.Zero(t, n, "a zoned sweep deleted a live outcome")
		})
	}
}

// Replicas that start together all migrate a fresh table at once: every
// New succeeds.
func TestConcurrentNewOnFreshTable(t *testing.T) {
	db := testDB(t)
	db.SetMaxOpenConns(32)
	for round := range 3 {
		table := tableName(t, db) + fmt.Sprint(round)
		t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
		const replicas = 16
		start := make(chan struct{})
		errs := make(chan error, replicas)
		for range replicas {
			go func() {
				<-start
				_, err := New(context.Background(), db, Options{Table: table})
				errs <- err
			}()
		}
		close(start)
		for range replicas {
			assert.NoError(t, <-errs)
		}
	}
}

// Many concurrent claims of few keys, under the server's REPEATABLE READ
// default, where inserts of one key deadlock on their next-key locks: no
// caller sees a deadlock or an error, and each key runs once.
func TestManyConcurrentClaimsSeeNoDeadlock(t *testing.T) {
	db := testDB(t)
	db.SetMaxOpenConns(64)
	b, _ := testBackend(t, db)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	other := idem.New[int](idem.Options{Backend: b}) // a second process's store
	defer other.Close()
	const keys, callers = 20, 64
	var runs [keys]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, callers*keys)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := s
			if c%2 == 1 {
				st = other
			}
			for k := range keys {
				key := fmt.Sprintf("k%d", (k+c)%keys)
				_, err := st.RunOnce(context.Background(), key, "p", func(context.Context) (int, error) {
					runs[(k+c)%keys].Add(1)
					return 1, nil
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range keys {
		assert.Equal(t, int32(1), runs[k].Load(), "key %d", k)
	}
}

// A result larger than the server's max_allowed_packet cannot be
// recorded: Complete fails with an error that names max_allowed_packet,
// and the claim stands, its owner's to complete with less (the Store
// replays the outcome from memory and reports it not recorded, with that
// error).
func TestValueLargerThanMaxAllowedPacket(t *testing.T) {
	db := testDB(t)
	var packet int
	require.NoError(t, db.QueryRow(`SELECT @@max_allowed_packet`).Scan(&packet))
	b, _ := testBackend(t, db)
	ctx := context.Background()
	claim := backend.Record{Key: "big", Token: "t1"}
	_, won, err := b.Claim(ctx, claim, time.Time{}, time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	done := claim
	done.Value = make([]byte, packet+1)
	err = b.Complete(ctx, done, time.Time{}, time.Hour)
	require.Error(t, err)
	assert.ErrorContains(t, err, "max_allowed_packet")
	rec, ok, err := b.Get(ctx, "big", time.Time{})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StatePending, rec.State, "the claim stands, nothing half written")
	done.Value = []byte("small")
	require.NoError(t, b.Complete(ctx, done, time.Time{}, time.Hour), "its owner completes it with less")

	// Through a Store: the outcome is reported not recorded, naming it.
	var log bytes.Buffer
	s := idem.New[[]byte](idem.Options{Backend: b, Logger: slog.New(slog.NewTextHandler(&log, nil)), SettleTimeout: time.Second})
	defer s.Close()
	_, err = s.RunOnce(ctx, "big2", "p", func(context.Context) ([]byte, error) { return make([]byte, packet+1), nil })
	require.NoError(t, err, "fn's success is the caller's")
	assert.Contains(t, log.String(), "max_allowed_packet")

	// A value well within it, larger than the other backends' tests use.
	mib := make([]byte, 4<<20)
	for i := range mib {
		mib[i] = byte(i)
	}
	_, err = s.RunOnce(ctx, "4mib", "p", func(context.Context) ([]byte, error) { return mib, nil })
	require.NoError(t, err)
	rec, ok, err = b.Get(ctx, "4mib", time.Time{})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, rec.State)
	var back []byte
	require.NoError(t, json.Unmarshal(rec.Value, &back))
	assert.True(t, bytes.Equal(mib, back), "recorded byte for byte")
}

// An unreachable database is a clear error from New, and nothing hangs.
func TestUnreachableDatabase(t *testing.T) {
	testDSN(t)
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/test?timeout=2s")
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = New(ctx, db, Options{})
	require.Error(t, err)
	assert.ErrorContains(t, err, "mysql:")
	assert.NoError(t, ctx.Err(), "answered before the deadline")
}

// Bad table names are refused before anything is sent.
func TestBadTableNames(t *testing.T) {
	db := testDB(t)
	for _, name := range []string{"a.b.c", ".t", "t.", "with`tick", "trailing ", strings.Repeat("x", 65)} {
		_, err := New(context.Background(), db, Options{Table: name})
		assert.Error(t, err, "%q", name)
	}
	b, err := New(context.Background(), nil, Options{})
	assert.Nil(t, b)
	assert.ErrorContains(t, err, "nil *sql.DB")
	//lint:ignore SA1012 a nil ctx is the bad input under test
	_, err = New(nil, db, Options{}) //nolint:staticcheck
	assert.ErrorContains(t, err, "nil context")
}

// A database-qualified table name works, and its migration finds it.
func TestQualifiedTableName(t *testing.T) {
	db := testDB(t)
	var current string
	require.NoError(t, db.QueryRow(`SELECT DATABASE()`).Scan(&current))
	table := current + "." + tableName(t, db)
	for range 2 { // the second New finds the table
		b, err := New(context.Background(), db, Options{Table: table})
		require.NoError(t, err)
		_, won, err := b.Claim(context.Background(), backend.Record{Key: "k", Token: "t"}, time.Time{}, time.Minute)
		require.NoError(t, err)
		_ = won
	}
}
