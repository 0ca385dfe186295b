package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// soundFile returns the bytes of a closed bbolt file of idem's, of about
// 128 KiB: records, expiry entries and, with pending, claims left pending,
// over several leaf pages and a branch page each. Its Close stamped it
// clean: without pending, the default Open then checks only the pages it
// reads itself, and the guard the rest as they are read; with pending,
// Open checks the whole file all the same.
func soundFile(tb testing.TB, pending bool) []byte {
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
		if pending && i%3 == 0 {
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

// unstamped returns a copy of data without its clean-stop stamp, as a
// file left by a process that was killed: Open checks it whole.
func unstamped(tb testing.TB, data []byte) []byte {
	tb.Helper()
	m, err := readMeta(bytes.NewReader(data))
	if err != nil {
		tb.Fatal(err)
	}
	out := bytes.Clone(data)
	clear(out[m.at+stampAt : m.at+stampAt+stampLen])
	return out
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

// pageDamages lists, for every page of data, damage at each 8-byte offset
// of its header and of its first elements (a leaf element's flags,
// position, key size and value size; a branch element's position, key
// size and child id), and at a few offsets further in, among its keys and
// values. The values written point elsewhere (another page's id: a cycle,
// a shared child; the page's own id; a huge number; zero) or claim sizes
// (a small key and a value of 2 GB, or of 0x65000071 bytes, that a record's
// page cannot hold). With full set, every 8-byte offset of every page.
func pageDamages(data []byte, pageSize int, seed uint64, full bool) []pageDamage {
	r := rand.New(rand.NewPCG(seed, 0))
	n := len(data) / pageSize
	var out []pageDamage
	for p := range n {
		count := int(binary.NativeEndian.Uint16(data[p*pageSize+10:]))
		end := min(pageHeaderSize+min(count, 4)*elementSize, pageSize)
		if full {
			end = pageSize
		}
		var offs []int
		for off := 0; off+8 <= end; off += 8 {
			offs = append(offs, off)
		}
		for range 2 {
			offs = append(offs, r.IntN(pageSize-8))
		}
		for _, off := range offs {
			for _, with := range []uint64{uint64(r.IntN(n)), uint64(p), ^uint64(0), 0, 0x7f000000<<32 | 16, 0x65000071<<32 | 16} {
				out = append(out, pageDamage{p, off, with})
			}
		}
	}
	return out
}

// A damageCase is how a damaged file is opened: which sound file it
// came from, with or without its stamp, and with which Check.
type damageCase struct {
	name  string
	data  []byte
	check Check
}

// damageCases are the ways Open meets a damaged file: a clean stop's
// file, whose Open reads only what it needs and leaves the rest to the
// guard (and CheckNever, which does so whatever the file); the same with
// claims pending, and without the stamp, which Open checks whole.
func damageCases(tb testing.TB) []damageCase {
	clean, pending := soundFile(tb, false), soundFile(tb, true)
	return []damageCase{
		{"stamped", clean, CheckUnclean},
		{"stamped, CheckNever", clean, CheckNever},
		{"unstamped", unstamped(tb, clean), CheckUnclean},
		{"stamped with claims pending", pending, CheckUnclean},
		{"unstamped with claims pending, CheckNever", unstamped(tb, pending), CheckNever},
		{"unstamped with claims pending", unstamped(tb, pending), CheckUnclean},
	}
}

// useDamaged uses every operation of a Backend opened on a damaged file,
// over keys of its own and new ones: what bbolt reads of idem's buckets
// after Open (the records, expiry and pending pages) must not hang it
// either. Errors are the damage's, not a hang: only that each returns
// matters.
func useDamaged(b *Backend, keys []string) {
	ctx := context.Background()
	now := time.Now()
	for _, key := range keys {
		if rec, ok, err := b.Get(ctx, key, now); err == nil && ok {
			_ = b.Release(ctx, key, rec.Token)
			_ = b.Forget(ctx, key, now.Add(2*time.Hour))
		}
		rec := backend.Record{Key: key + "-new", Token: "damage", State: backend.StatePending}
		if _, claimed, err := b.Claim(ctx, rec, now, time.Minute); err == nil && claimed {
			rec.Value = []byte("1")
			_ = b.Complete(ctx, rec, now, time.Hour)
		}
	}
	_, _ = b.Sweep(ctx, now.Add(3*time.Hour), 1000)
	_ = b.Each(ctx, func(backend.Record) error { return nil })
}

// Every page of a 128 KiB file damaged in 8 bytes, one place at a time,
// over its header, its elements and its keys and values, with and without
// the clean-stop stamp and with each Check: Open and then every operation
// answer each file (ErrCorrupt or a working backend) within a bound, and
// the file does not grow without bound. (A damaged page that pointed back
// into a bucket's walk once made Open's record check loop for ever; after
// a clean stop, a damaged record's size once made a new key copy
// gigabytes, and an untyped page made Open go round.)
//
// By default each damage is tried in one of the cases, in turn; with
// IDEM_DAMAGE_SWEEP=all, every 8-byte offset of every page in every case
// (some 600,000 files: most of an hour).
func TestOpenDamagedPageSweep(t *testing.T) {
	const pageSize = 4096
	cases := damageCases(t)
	full := os.Getenv("IDEM_DAMAGE_SWEEP") == "all"
	keys := []string{"order-0000", "order-0001", "order-0075", "order-0149", "zzz"}
	dir := t.TempDir()
	var corrupt, opened, tried int
	for ci, c := range cases {
		damages := pageDamages(c.data, pageSize, 23+uint64(ci), full)
		for i, d := range damages {
			if !full && (i%len(cases) != ci || testing.Short() && i%8 != 0) {
				continue
			}
			tried++
			path := filepath.Join(dir, fmt.Sprintf("d%d.db", tried))
			if err := os.WriteFile(path, d.apply(c.data, pageSize), 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				b, err := Open(path, &Options{LockTimeout: -1, noSync: true, Check: c.check})
				if err == nil {
					useDamaged(b, keys)
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
			case <-time.After(20 * time.Second):
				_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) // where it hung
				t.Fatalf("%s: hung on page %d with 8 bytes at offset %d set to %#x", c.name, d.page, d.off, d.with)
			}
			if fi, err := os.Stat(path); err == nil && fi.Size() > int64(len(c.data))+64<<20 {
				t.Errorf("%s: page %d with 8 bytes at offset %d set to %#x: the file grew to %d bytes", c.name, d.page, d.off, d.with, fi.Size())
			}
			os.Remove(path)
		}
	}
	t.Logf("%d damaged files: %d refused at Open, %d opened", tried, corrupt, opened)
}
