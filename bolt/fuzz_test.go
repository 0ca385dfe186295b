package bolt

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// FuzzOpen feeds damaged database files to Open and, if it accepts one, to
// every operation: none may panic, hang, or grow the file past a bound.
// The input's length picks the Check (CheckAlways, CheckUnclean or
// CheckNever), so that a damaged file that bears a clean stop's stamp is
// also opened without the whole check, its pages left to the guard.
// .ci/run runs it for a few seconds; seeds are sound files and damaged
// copies of them.
func FuzzOpen(f *testing.F) {
	seed := filepath.Join(f.TempDir(), "seed.db")
	b, err := Open(seed, nil)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		rec := backend.Record{Key: key, Token: "t", State: backend.StatePending}
		if _, _, err := b.Claim(ctx, rec, time.Now(), 0); err != nil {
			f.Fatal(err)
		}
		rec.Value = []byte(`{"charge":1}`)
		if err := b.Complete(ctx, rec, time.Now(), time.Millisecond); err != nil {
			f.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		f.Fatal(err)
	}
	data, err := os.ReadFile(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	for _, at := range []int{16, 4096 + 16, 2*4096 + 10, 3*4096 + 28, 4*4096 + 100} {
		if at < len(data) {
			d := append([]byte(nil), data...)
			d[at] ^= 0x7f
			f.Add(d)
		}
	}

	// Page-level damage, which flipped bytes seldom reach: 8 bytes over
	// the header, elements, keys or values of every page of a 128 KiB
	// file, stamped clean, with claims pending and without (the sweep in
	// damage_test.go tries every offset).
	for _, pending := range []bool{false, true} {
		sound := soundFile(f, pending)
		for i, d := range pageDamages(sound, 4096, 24, false) {
			if i%13 == 0 {
				f.Add(d.apply(sound, 4096))
			}
		}
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "fuzz.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			check := []Check{CheckAlways, CheckUnclean, CheckNever}[len(data)%3]
			b, err := Open(path, &Options{LockTimeout: -1, noSync: true, Check: check})
			if err != nil {
				return
			}
			defer b.Close()
			useDamaged(b, []string{"a", "b", "c", "order-0000", "order-0075", "order-0149"})
		}()
		select {
		case <-done:
		case <-time.After(3 * time.Second): // well inside CI's 10 s, so that a hang is kept as a failing input
			t.Fatal("a damaged file hung the backend")
		}
		// bbolt grows a file in steps, doubling up to 1 GB at a time; a
		// few small writes may take it one step. Runaway growth (3.2 GB
		// once, from one damaged byte) is what must not happen.
		if fi, err := os.Stat(path); err == nil && fi.Size() > int64(len(data))+64<<20 {
			t.Fatalf("a damaged file of %d bytes grew to %d", len(data), fi.Size())
		}
	})
}
