package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

type receipt struct {
	Charge int `json:"charge"`
	Amount int `json:"amount"`
}

func TestRestartReplays(t *testing.T) {
	b, path := openTemp(t, nil)
	ctx := context.Background()
	var calls atomic.Int32
	fn := func(context.Context) (receipt, error) {
		return receipt{Charge: int(calls.Add(1)), Amount: 450}, nil
	}
	declined := func(context.Context) (receipt, error) {
		calls.Add(1)
		return receipt{}, idem.Final(errors.New("card declined"))
	}

	s := idem.New[receipt](idem.Options{Backend: b})
	first, err := s.RunOnce(ctx, "order-101", "450", fn)
	require.NoError(t, err)
	_, err = s.RunOnce(ctx, "order-102", "990", declined)
	require.True(t, idem.IsFinal(err))
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())

	b, err = Open(path, nil) // the process restarts
	require.NoError(t, err)
	defer b.Close()
	assert.Zero(t, b.Interrupted())
	s = idem.New[receipt](idem.Options{Backend: b})
	defer s.Close()
	replay, err := s.RunOnce(ctx, "order-101", "450", fn)
	require.NoError(t, err)
	assert.Equal(t, first, replay)
	_, err = s.RunOnce(ctx, "order-102", "990", declined)
	assert.EqualError(t, err, "card declined")
	assert.True(t, idem.IsFinal(err), "a final error stays final across a restart")
	_, err = s.RunOnce(ctx, "order-101", "451", fn)
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.Equal(t, int32(2), calls.Load(), "fn ran again after the restart")
}

// 64 goroutines each request 200 keys; every key is requested by 4 of them
// at once, against one file.
func TestConcurrentCallersRunEachKeyOnce(t *testing.T) {
	const goroutines, perGoroutine, callersPerKey = 64, 200, 4
	b, _ := openTemp(t, nil)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	var runs [goroutines * perGoroutine / callersPerKey]atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			group := g / callersPerKey // these 4 goroutines share keys
			for i := range perGoroutine {
				k := group*perGoroutine + i
				v, err := s.RunOnce(context.Background(), fmt.Sprint("key-", k), k, func(context.Context) (int, error) {
					runs[k].Add(1)
					return k * 10, nil
				})
				if !assert.NoError(t, err) || !assert.Equal(t, k*10, v) {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for k := range runs {
		require.Equal(t, int32(1), runs[k].Load(), "key-%d", k)
	}
	assert.Zero(t, s.Len())
}

// runKeys completes the keys from first to last (exclusive), named by name,
// from workers goroutines at once, so that their writes share commits.
func runKeys(t *testing.T, s *idem.Store[receipt], first, last, workers int, name func(int) string) {
	t.Helper()
	fn := func(context.Context) (receipt, error) { return receipt{Charge: 1, Amount: 450}, nil }
	var next atomic.Int64
	next.Store(int64(first))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int(next.Add(1) - 1); k < last; k = int(next.Add(1) - 1) {
				if _, err := s.RunOnce(context.Background(), name(k), nil, fn); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// With a bolt backend a day of completed keys lives in the file, not the
// heap: the in-memory table ends empty and the heap does not grow with the
// number of keys.
func TestCompletedKeysLeaveMemory(t *testing.T) {
	const keys, workers = 200_000, 64
	b, _ := openTemp(t, &Options{noSync: true}) // this test is about memory, not fsync
	s := idem.New[receipt](idem.Options{Backend: b})
	defer s.Close()
	name := func(k int) string { return fmt.Sprintf("key-%07d", k) }
	heapAt := make(map[int]uint64)
	run := func(first, last int) {
		runKeys(t, s, first, last, workers, name)
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heapAt[last] = ms.HeapAlloc
	}
	run(0, keys/4)
	run(keys/4, keys)
	assert.Zero(t, s.Len(), "memory must hold only keys in flight")
	grown := int64(heapAt[keys]) - int64(heapAt[keys/4])
	t.Logf("heap after %d keys: %d KiB; after %d: %d KiB", keys/4, heapAt[keys/4]>>10, keys, heapAt[keys]>>10)
	// 150,000 more entries of ~200 bytes would be ~30 MiB.
	assert.Less(t, grown, int64(4<<20), "the heap grew by %d KiB", grown>>10)
}

// Expired records are swept from the file, and under a steady load with a
// short TTL the file stops growing: freed pages are reused.
func TestSweepKeepsFileBounded(t *testing.T) {
	b, path := openTemp(t, &Options{noSync: true})
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := idem.New[receipt](idem.Options{Backend: b, TTL: time.Minute, Now: clock.Now, SweepInterval: -1})
	defer s.Close()
	ctx := context.Background()

	// Unswept, 12 rounds of 3,000 records would take the file past 6 MiB.
	const rounds, perRound = 12, 3000
	sizes := make([]int64, rounds)
	for r := range rounds {
		runKeys(t, s, 0, perRound, 16, func(i int) string { return fmt.Sprintf("round-%02d-key-%05d", r, i) })
		clock.Advance(time.Minute) // this round's keys expire
		n, err := s.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, perRound, n, "round %d", r)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		sizes[r] = fi.Size()
	}
	count := 0
	require.NoError(t, b.Each(ctx, func(backend.Record) error { count++; return nil }))
	assert.Zero(t, count, "swept records must leave the file")
	t.Logf("file size by round: %v", sizes)
	assert.Equal(t, sizes[3], sizes[rounds-1], "the file kept growing under a steady load")
}

// A clock at the Unix epoch, common in tests, once made records decode with
// different times than they were written with, orphaning index entries.
func TestEpochClockRoundTrips(t *testing.T) {
	b, path := openTemp(t, nil)
	epoch := time.Unix(0, 0)
	s := idem.New[int](idem.Options{Backend: b, Now: func() time.Time { return epoch }})
	_, err := s.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())

	b, err = Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	assert.Zero(t, b.Interrupted(), "a completed key was taken for one left in flight")
	rec, ok, err := b.Get(context.Background(), "k", epoch)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assert.True(t, rec.CreatedAt.Equal(epoch))
}

// openWithDamagedRecord returns a Backend over a file whose record of key
// "k" is garbage, as a damaged page would leave it.
func openWithDamagedRecord(t *testing.T) *Backend {
	t.Helper()
	b, path := openTemp(t, nil)
	require.NoError(t, b.Close())
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketRecords).Put([]byte("k"), []byte("garbage"))
	}))
	require.NoError(t, db.Close())
	b, err = Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// A record whose bytes are damaged is an error to read, and the operator can
// still forget it.
func TestForgetUnreadableRecord(t *testing.T) {
	b := openWithDamagedRecord(t)
	s := idem.New[int](idem.Options{Backend: b})
	defer s.Close()
	ctx := context.Background()
	_, err := s.RunOnce(ctx, "k", nil, func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, ErrCorrupt)
	require.NoError(t, s.Forget(ctx, "k"))
	v, err := s.RunOnce(ctx, "k", nil, func(context.Context) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v)
}

// A claim that fails on a damaged record wrote nothing and says so: the
// store leaves no release behind to watch, so Close does not wait for its
// SettleTimeout (an hour here).
func TestClaimOfDamagedRecordIsRefused(t *testing.T) {
	b := openWithDamagedRecord(t)
	_, _, err := b.Claim(context.Background(), backend.Record{Key: "k", Token: "t"}, time.Now(), time.Minute)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorIs(t, err, backend.ErrRefused, "nothing was written")

	s := idem.New[int](idem.Options{Backend: b, SettleTimeout: time.Hour})
	_, err = s.RunOnce(context.Background(), "k", nil, func(context.Context) (int, error) { return 1, nil })
	assert.ErrorIs(t, err, ErrCorrupt)
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute): // an hour's wait, cut short
		t.Fatal("Close waits to release a claim that was never written")
	}
}

// The record is damaged between a claim's read and its write: the claim's
// write finds it in the same group commit as the Update that damaged it,
// and is refused there too.
func TestClaimFindingDamageInItsWriteIsRefused(t *testing.T) {
	b, _ := openTemp(t, nil)
	inFn, damage := make(chan struct{}), make(chan struct{})
	updated := make(chan error, 1)
	go func() {
		updated <- b.Update(context.Background(), func(tx *bbolt.Tx) error {
			close(inFn)
			<-damage
			return tx.Bucket(bucketRecords).Put([]byte("k"), []byte("garbage"))
		})
	}()
	<-inFn // the committer's transaction is lent to Update's fn
	claimed := make(chan error, 1)
	go func() {
		_, _, err := b.Claim(context.Background(), backend.Record{Key: "k", Token: "t"}, time.Now(), time.Minute)
		claimed <- err
	}()
	for len(b.reqs) == 0 { // the claim read no record, and queued its write
		runtime.Gosched()
	}
	close(damage)
	require.NoError(t, <-updated)
	err := <-claimed
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorIs(t, err, backend.ErrRefused)
}

// endsAfterFirstLook is a ctx that ends between the first time it is
// asked and the second: after a claim's read, before its write.
type endsAfterFirstLook struct {
	context.Context
	looks atomic.Int32
}

func (c *endsAfterFirstLook) Err() error {
	if c.looks.Add(1) > 1 {
		return context.DeadlineExceeded
	}
	return nil
}

func TestClaimWhoseCtxEndsBeforeItsWriteIsRefused(t *testing.T) {
	b, _ := openTemp(t, nil)
	_, _, err := b.Claim(&endsAfterFirstLook{Context: context.Background()}, backend.Record{Key: "k", Token: "t"}, time.Now(), time.Minute)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, backend.ErrRefused, "the write was never sent")
	_, ok, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.False(t, ok)
}

// A read-only Backend writes nothing: an empty file stays empty, a
// database's bytes are unchanged, and writes are refused.
func TestReadOnly(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.db")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err := Open(empty, &Options{ReadOnly: true})
	assert.ErrorIs(t, err, ErrNotIdem)
	fi, err := os.Stat(empty)
	require.NoError(t, err)
	assert.Zero(t, fi.Size(), "a read-only open turned an empty file into a database")
	_, err = Open(filepath.Join(dir, "missing.db"), &Options{ReadOnly: true})
	assert.ErrorIs(t, err, os.ErrNotExist)

	path := filepath.Join(dir, "idem.db")
	b, err := Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, _, err = b.Claim(ctx, backend.Record{Key: "k", Token: "t", State: backend.StatePending}, time.Now(), 0)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	ro, err := Open(path, &Options{ReadOnly: true})
	require.NoError(t, err)
	rec, ok, err := ro.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "t", rec.Token)
	assert.Equal(t, backend.StateInterrupted, rec.State, "its owner is gone: no writer holds the file")
	_, _, err = ro.Claim(ctx, backend.Record{Key: "k2", Token: "t"}, time.Now(), 0)
	assert.ErrorIs(t, err, ErrReadOnly)
	assert.ErrorIs(t, ro.Forget(ctx, "k", time.Now()), ErrReadOnly)
	require.NoError(t, ro.Close())
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a read-only open changed the file")
}
