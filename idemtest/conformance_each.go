package idemtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eachRecords is how many records testEachPagesAndAllowsCalls lists: more
// than a few pages of any backend.
const eachRecords = 1100

// testEachPagesAndAllowsCalls: Each lists more records than one page, and
// fn may call the backend (a read, a delete, a new claim) from inside it,
// as Lister's contract says: no read is held open around fn, so nothing
// deadlocks, and every record present throughout comes at least once.
func testEachPagesAndAllowsCalls(t *testing.T, b backend.Backend) {
	lister, ok := b.(backend.Lister)
	if !ok {
		t.Skip("the backend cannot list its records")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := make([]string, eachRecords)
	for i := range keys {
		keys[i] = fmt.Sprintf("each-%04d", i)
	}
	fill(t, b, keys)

	seen := map[string]int{}
	var forgot []string
	added := 0
	err := lister.Each(ctx, func(rec backend.Record) error {
		seen[rec.Key]++
		if _, ok, err := b.Get(ctx, rec.Key, time.Now()); err != nil || !ok {
			return fmt.Errorf("Get(%q) from inside Each = %v, %v", rec.Key, ok, err)
		}
		if rec.State == backend.StateCompleted && len(forgot) < 50 && seen[rec.Key] == 1 {
			if err := b.Forget(ctx, rec.Key, time.Now()); err != nil {
				return fmt.Errorf("Forget(%q) from inside Each: %w", rec.Key, err)
			}
			forgot = append(forgot, rec.Key)
		}
		if added < 20 {
			added++
			if _, _, err := b.Claim(ctx, request(fmt.Sprintf("each-new-%02d", added)), time.Now(), lease); err != nil {
				return fmt.Errorf("Claim from inside Each: %w", err)
			}
		}
		return nil
	})
	require.NoError(t, err, "Each with fn calling the backend")
	for _, k := range keys {
		assert.GreaterOrEqual(t, seen[k], 1, "record %q present throughout was not listed", k)
	}
	for k := range seen {
		if !strings.HasPrefix(k, "each-") {
			t.Errorf("Each listed %q, which this test never wrote", k)
		}
	}
	for _, k := range forgot {
		_, ok := get(t, b, k)
		assert.False(t, ok, "%q forgotten from inside Each is still there", k)
	}
}

// fill stores a record for every key, most completed and every tenth
// pending, from a few goroutines.
func fill(t *testing.T, b backend.Backend, keys []string) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				claim, won, err := b.Claim(ctx, request(keys[i]), time.Now(), lease)
				switch {
				case err != nil:
					errs <- err
				case !won:
					errs <- fmt.Errorf("claim of a free key %q lost", keys[i])
				case i%10 != 0:
					if err := b.Complete(ctx, outcome(claim, "v"), time.Now(), ttl); err != nil {
						errs <- err
					}
				}
			}
		}()
	}
	for i := range keys {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "filling the backend")
	}
}
