package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	bbolt "go.etcd.io/bbolt"
)

// useDamagedFurther uses the operations useDamaged leaves out, on a
// Backend opened on a damaged file: a renewal, a step and a resumption of
// its own keys' claims, RunOnceTx on them and on new keys through a
// Store, and the Store's listing. Only that each returns matters.
func useDamagedFurther(b *Backend, keys []string) {
	ctx := context.Background()
	now := time.Now()
	for _, key := range keys {
		_ = b.Renew(ctx, key, "t", now, time.Minute)
		_ = b.RecordStep(ctx, key, "t", backend.Step{Name: "s", Value: []byte("1")}, now)
		_, _ = b.Resume(ctx, key, "t", "resumed", now.Add(2*time.Hour), time.Minute)
	}
	s := idem.New[int](idem.Options{Backend: b, SweepInterval: -1, SettleTimeout: time.Second})
	defer s.Close()
	for _, key := range keys {
		for _, k := range []string{key, key + "-tx"} {
			_, _ = RunOnceTx(ctx, s, k, "p", func(context.Context, *bbolt.Tx) (int, error) { return 1, nil })
		}
	}
	for _, err := range s.Records(ctx) {
		if err != nil {
			break
		}
	}
}

// The damage sweep of TestOpenDamagedPageSweep (one damage a case, in
// turn; CheckAlways too), met by the operations it does not use: Renew, RecordStep,
// Resume, RunOnceTx and the Store's listing each answer a damaged file
// (an error, or a working backend) within a bound, without a panic.
func TestDamagedPageSweepOtherOperations(t *testing.T) {
	const pageSize = 4096
	cases := damageCases(t)
	// And CheckAlways, which checks every file whole at Open, stamped or
	// not, and guards the reads after it all the same.
	for _, c := range cases {
		if c.check == CheckUnclean {
			cases = append(cases, damageCase{c.name + ", CheckAlways", c.data, CheckAlways})
		}
	}
	keys := []string{"order-0000", "order-0003", "order-0075", "order-0149", "zzz"}
	dir := t.TempDir()
	tried := 0
	for ci, c := range cases {
		damages := pageDamages(c.data, pageSize, 41+uint64(ci), false)
		for i, d := range damages {
			if i%len(cases) != ci || testing.Short() && i%8 != 0 {
				continue
			}
			tried++
			path := filepath.Join(dir, fmt.Sprintf("d%d.db", tried))
			if err := os.WriteFile(path, d.apply(c.data, pageSize), 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				b, err := Open(path, &Options{LockTimeout: -1, noSync: true, Check: c.check})
				if err == nil {
					useDamagedFurther(b, keys)
					b.Close()
				}
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) // where it hung
				t.Fatalf("%s: hung on page %d with 8 bytes at offset %d set to %#x", c.name, d.page, d.off, d.with)
			}
			os.Remove(path)
		}
	}
	t.Logf("%d damaged files", tried)
}
