package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConformanceSteps(t *testing.T) {
	rdb := testClient(t)
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		flushScripts(t, rdb) // every subtest starts on a server that knows no script
		return testBackend(t, rdb)
	})
}

func TestClusterConformanceSteps(t *testing.T) {
	rdb := testClusterClient(t)
	idemtest.RunSteps(t, func(t *testing.T) backend.Stepper {
		flushScripts(t, rdb)
		return testClusterBackend(t, rdb)
	})
}

func TestSingleStepsColdScriptCache(t *testing.T) {
	rdb := testClient(t)
	testStepsColdScriptCache(t, rdb, testBackend(t, rdb))
}

func TestClusterStepsColdScriptCache(t *testing.T) {
	rdb := testClusterClient(t)
	testStepsColdScriptCache(t, rdb, testClusterBackend(t, rdb))
}

// testStepsColdScriptCache empties the script cache before every call, so
// that each script RecordStep, Resume and Complete run is unknown to the
// node when it is first sent; its keys fall in several slots.
func testStepsColdScriptCache(t *testing.T, rdb redis.UniversalClient, b *Backend) {
	ctx := context.Background()
	cold := func() { t.Helper(); flushScripts(t, rdb) }
	for i := range 6 {
		key := fmt.Sprintf("cold-%d", i)
		cold()
		claim, ok, err := b.Claim(ctx, backend.Record{Key: key, Token: "dead-" + key}, time.Now(), time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		cold()
		require.NoError(t, b.RecordStep(ctx, key, claim.Token, backend.Step{Name: "one", Value: []byte("1")}, time.Now()), key)
		cold()
		// The lease is shortened only now, so a slow machine cannot let it
		// lapse before the step is in.
		require.NoError(t, b.Renew(ctx, key, claim.Token, time.Now(), 100*time.Millisecond), key)
		require.Eventually(t, func() bool {
			rec, _, err := b.Get(ctx, key, time.Now())
			return err == nil && rec.State == backend.StateInterrupted
		}, 10*time.Second, 10*time.Millisecond, "the lease of %s lapses", key)
		cold()
		rec, err := b.Resume(ctx, key, claim.Token, "next-"+key, time.Now(), time.Minute)
		require.NoError(t, err, key)
		require.Len(t, rec.Steps, 1, key)
		cold()
		require.NoError(t, b.RecordStep(ctx, key, rec.Token, backend.Step{Name: "two", Value: []byte("2")}, time.Now()), key)
		cold()
		rec.Value = []byte("done")
		require.NoError(t, b.Complete(ctx, rec, time.Now(), time.Minute), key)
		got, ok, err := b.Get(ctx, key, time.Now())
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, backend.StateCompleted, got.State, key)
		assert.Len(t, got.Steps, 2, key)
	}
}

func TestSingleConcurrentSteps(t *testing.T) {
	rdb := testClient(t)
	testConcurrentSteps(t, testBackend(t, rdb))
}

func TestClusterConcurrentSteps(t *testing.T) {
	rdb := testClusterClient(t)
	testConcurrentSteps(t, testClusterBackend(t, rdb))
}

// testConcurrentSteps records steps of one claim from many goroutines while
// it is renewed: every compare-and-set that loses a race reads again, and
// no step is lost.
func testConcurrentSteps(t *testing.T, b *Backend) {
	ctx := context.Background()
	claim, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "tok"}, time.Now(), time.Minute)
	require.NoError(t, err)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			assert.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: fmt.Sprint("step-", i), Value: []byte{byte(i)}}, time.Now()))
		}()
		go func() {
			defer wg.Done()
			assert.NoError(t, b.Renew(ctx, "k", claim.Token, time.Now(), time.Minute))
		}()
	}
	wg.Wait()
	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, n)
	for _, s := range rec.Steps {
		assert.Equal(t, fmt.Sprint("step-", s.Value[0]), s.Name)
	}
}

// TestStepsLayout: the steps follow the record, their length a fifth
// header field, and Complete carries them over; a record without steps is
// stored as before steps.
func TestStepsLayout(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	raw := func(key string) string {
		t.Helper()
		v, err := rdb.Get(ctx, b.key(key)).Result()
		require.NoError(t, err)
		return v
	}
	claim, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "tok"}, time.Now(), time.Minute)
	require.NoError(t, err)
	step := backend.Step{Name: "charge", Value: []byte("a|b\x02"), Failed: true, ErrMsg: "declined"}
	require.NoError(t, b.RecordStep(ctx, "k", "tok", step, time.Now()))

	rec, _, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	steps := string(backend.AppendSteps(nil, rec.Steps))
	pending := raw("k")
	created := fmt.Sprint(claim.CreatedAt.UnixMilli())
	assert.Regexp(t, fmt.Sprintf(`^1\|\d+\|tok\|%s\|%d\|\x02`, created, len(steps)), pending)
	assert.True(t, strings.HasSuffix(pending, steps), "the steps end the value")

	claim.Value = []byte("done")
	require.NoError(t, b.Complete(ctx, claim, time.Now(), time.Minute))
	done := raw("k")
	assert.True(t, strings.HasPrefix(done, fmt.Sprintf("2|0|tok|%s|%d|\x02", created, len(steps))), "%q", done)
	assert.True(t, strings.HasSuffix(done, steps), "Complete kept the steps")
	rec, _, err = b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	assert.Equal(t, "done", string(rec.Value))
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, step.Value, rec.Steps[0].Value)
	assert.Equal(t, step.ErrMsg, rec.Steps[0].ErrMsg)

	// Without steps: the header of four fields, then the record (version 2).
	plain, _, err := b.Claim(ctx, backend.Record{Key: "plain", Token: "tok"}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.NoError(t, b.Complete(ctx, plain, time.Now(), time.Minute))
	enc, err := blob(backend.Record{Key: "plain", State: backend.StateCompleted})
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("2|0|tok|%d|%s", plain.CreatedAt.UnixMilli(), enc), raw("plain"))
}

// TestStepOnValueWithoutCreated: a pending record written before the
// header had its created field takes a step, which writes the field
// first, so that the steps' length is not read as it.
func TestStepOnValueWithoutCreated(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	ctx := context.Background()
	createdAt := time.UnixMilli(1_700_000_000_123)
	enc, err := blob(backend.Record{Key: "old", State: backend.StatePending, CreatedAt: createdAt})
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, b.key("old"), "1|0|tok|"+string(enc), 0).Err())

	require.NoError(t, b.RecordStep(ctx, "old", "tok", backend.Step{Name: "s", Value: []byte("v")}, time.Now()))
	rec, ok, err := b.Get(ctx, "old", time.Now())
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, rec.CreatedAt.Equal(createdAt), "created %v", rec.CreatedAt)
	require.Len(t, rec.Steps, 1)
	require.NoError(t, b.Complete(ctx, backend.Record{Key: "old", Token: "tok", Value: []byte("done")}, time.Now(), time.Minute))
	rec, _, err = b.Get(ctx, "old", time.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assert.Len(t, rec.Steps, 1)
}

// TestStepsThroughStore: with Resume, an operation that fails after two
// steps stays at its recovery point in Redis, and the retry runs only the
// step that had not finished.
func TestStepsThroughStore(t *testing.T) {
	rdb := testClient(t)
	b := testBackend(t, rdb)
	s := idem.New[string](idem.Options{Backend: b, Resume: true, Lease: time.Second, SweepInterval: -1})
	defer s.Close()
	ctx := context.Background()
	var runs [3]atomic.Int32
	failures := 1
	fn := func(ctx context.Context) (string, error) {
		a, err := idem.Step(ctx, "one", func(context.Context) (string, error) { runs[0].Add(1); return "a", nil })
		if err != nil {
			return "", err
		}
		c, err := idem.Step(ctx, "two", func(context.Context) (string, error) { runs[1].Add(1); return "b", nil })
		if err != nil {
			return "", err
		}
		runs[2].Add(1)
		if failures > 0 {
			failures--
			return "", errors.New("the bank is unavailable")
		}
		return a + c, nil
	}
	_, err := s.RunOnce(ctx, "k", "p", fn)
	require.Error(t, err)
	rec, ok, err := b.Get(ctx, "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok, "the key is not released")
	assert.Len(t, rec.Steps, 2)

	got, err := s.RunOnce(ctx, "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, "ab", got)
	assert.Equal(t, [3]int32{1, 1, 2}, [3]int32{runs[0].Load(), runs[1].Load(), runs[2].Load()})
}
