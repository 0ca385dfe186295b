package bolt

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// soundFile returns the bytes of a closed bbolt file of idem's, of about
// 128 KiB: records, expiry entries and pending claims over several leaf
// pages and a branch page each.
func soundFile(tb testing.TB) []byte {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "sound.db")
	b, err := Open(path, &Options{noSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	for i := range 150 {
		rec := backend.Record{Key: fmt.Sprintf("order-%04d", i), Token: "t", State: backend.StatePending}
		if _, _, err := b.Claim(ctx, rec, now, time.Hour); err != nil {
			tb.Fatal(err)
		}
		if i%3 == 0 {
			continue // left pending
		}
		rec.Value = []byte(`{"charge":1}`)
		if err := b.Complete(ctx, rec, now, time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// pageDamage is 8 bytes written over one offset of one page.
type pageDamage struct {
	page, off int
	with      uint64
}

func (d pageDamage) apply(data []byte, pageSize int) []byte {
	out := append([]byte(nil), data...)
	binary.NativeEndian.PutUint64(out[d.page*pageSize+d.off:], d.with)
	return out
}

// pageDamages lists, for every page of a file of n pages, damage at each
// 16-byte offset of its header and first elements, and at a few offsets
// further in, with values that point elsewhere: another page's id (a
// cycle, a shared child), the page's own id, a huge number, zero.
// With full set, every 8-byte offset of every page.
func pageDamages(n, pageSize int, seed uint64, full bool) []pageDamage {
	r := rand.New(rand.NewPCG(seed, 0))
	var out []pageDamage
	for p := range n {
		offs := []int{}
		for off := 0; off < 160; off += 16 {
			offs = append(offs, off)
		}
		if full {
			offs = offs[:0]
			for off := 0; off+8 <= pageSize; off += 8 {
				offs = append(offs, off)
			}
		}
		for range 2 {
			offs = append(offs, r.IntN(pageSize-8))
		}
		for _, off := range offs {
			for _, with := range []uint64{uint64(r.IntN(n)), uint64(p), ^uint64(0), 0} {
				out = append(out, pageDamage{p, off, with})
			}
		}
	}
	return out
}

// Every page of a 128 KiB file damaged in 8 bytes, one place at a time:
// Open answers each (ErrCorrupt or a working backend) within a bound, and
// never spins (a damaged page that pointed back into a bucket's walk once
// made Open's record check loop for ever).
func TestOpenDamagedPageSweep(t *testing.T) {
	data := soundFile(t)
	const pageSize = 4096
	n := len(data) / pageSize
	// IDEM_DAMAGE_SWEEP=all: every 8-byte offset (about 80,000 files, minutes).
	damages := pageDamages(n, pageSize, 23, os.Getenv("IDEM_DAMAGE_SWEEP") == "all")
	if testing.Short() {
		damages = damages[:len(damages)/8]
	}
	dir := t.TempDir()
	var corrupt, opened int
	for i, d := range damages {
		path := filepath.Join(dir, fmt.Sprintf("d%d.db", i))
		if err := os.WriteFile(path, d.apply(data, pageSize), 0o600); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			b, err := Open(path, &Options{LockTimeout: -1, noSync: true, Check: CheckAlways})
			if err == nil {
				// A damaged record is the key's error, not a hang: only
				// that the walk ends matters here.
				_ = b.Each(context.Background(), func(backend.Record) error { return nil })
				b.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				corrupt++
			} else {
				opened++
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Open hung on page %d with 8 bytes at offset %d set to %#x", d.page, d.off, d.with)
		}
		os.Remove(path)
	}
	t.Logf("%d damaged files: %d refused, %d opened", len(damages), corrupt, opened)
}
