package bolt

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// within runs fn on a goroutine of its own and returns its error, or fails
// the test if fn has not returned after d: a hang is a failure, not a
// test that never ends. (A hung fn's goroutine is left behind.)
func within(t *testing.T, d time.Duration, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

// requireStamped asserts that the file at path bears a clean stop's stamp,
// so that the default Open skips its whole check.
func requireStamped(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m, err := readMeta(f)
	require.NoError(t, err)
	require.True(t, stamped(f, m), "the file bears no clean-stop stamp")
}

// A record's value size damaged after a clean stop: the default Open skips
// the whole check (the stamp holds), so what bbolt later reads of the
// records and expiry buckets must be checked as it reads it. A new key
// filed beside the damaged record, and a sweep of records expired beside
// it, once hung for good (bbolt copying the gigabytes the size claimed);
// now each is ErrCorrupt at once, allocating no more than a record may
// hold, and the file does not grow.
func TestCleanStopDamagedValueSizeIsBounded(t *testing.T) {
	ran := func(context.Context) (string, error) { return "ran", nil }
	later := func() time.Time { return time.Now().Add(2 * time.Hour) } // recordsFile's records have expired
	for _, size := range []uint32{0x65000071, 0x7f000000} {
		for _, use := range []struct {
			name string
			now  func() time.Time
			fn   func(context.Context, *idem.Store[string]) error
		}{
			{"RunOnce of a new key", nil, func(ctx context.Context, s *idem.Store[string]) error {
				_, err := s.RunOnce(ctx, "key-100a", nil, ran)
				return err
			}},
			{"Sweep", later, func(ctx context.Context, s *idem.Store[string]) error {
				_, err := s.Sweep(ctx)
				return err
			}},
		} {
			t.Run(fmt.Sprintf("%#x/%s", size, use.name), func(t *testing.T) {
				path := recordsFile(t)
				setValueSize(t, path, "key-100", size)
				requireStamped(t, path)
				before, err := os.Stat(path)
				require.NoError(t, err)
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				err = within(t, 20*time.Second, use.name, func() error {
					b, err := Open(path, &Options{noSync: true})
					if err != nil {
						return err
					}
					defer b.Close()
					s := idem.New[string](idem.Options{Backend: b, Now: use.now})
					defer s.Close()
					return use.fn(context.Background(), s)
				})
				runtime.ReadMemStats(&m1)
				assert.ErrorIs(t, err, ErrCorrupt)
				assert.Less(t, m1.TotalAlloc-m0.TotalAlloc, uint64(256<<20), "the damaged size was believed: bytes allocated")
				after, err := os.Stat(path)
				require.NoError(t, err)
				assert.LessOrEqual(t, after.Size(), before.Size()+1<<20, "the file grew")
			})
		}
	}
}

// A page of the pending bucket with no elements, typed a branch (or a
// freelist, which bbolt's cursor also takes for a branch), passed the check
// of a clean stop's Open: the page was read only through its elements. Its
// cursor then followed a child id from past the page's end, here the page
// itself, so Open's look for pending claims (nothingPending) went round for
// ever. Now a branch with no elements, or a page of another type in a tree,
// is ErrCorrupt, in every Check mode.
func TestCleanStopEmptyBranchPageIsCorrupt(t *testing.T) {
	for _, flags := range []uint16{branchPageFlag, freelistPageFlag} {
		path := soundPath(t)
		root := rootPage(t, path, bucketPending)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		off := int(root) * os.Getpagesize()
		le := binary.NativeEndian
		le.PutUint16(data[off+8:], flags)
		le.PutUint16(data[off+10:], 0)                  // no elements,
		le.PutUint64(data[off+pageHeaderSize+8:], root) // and, past them, a first child: itself
		require.NoError(t, os.WriteFile(path, data, 0o600))
		requireStamped(t, path)
		for _, check := range []Check{CheckUnclean, CheckNever, CheckAlways} {
			for _, ro := range []bool{false, true} {
				err := within(t, 20*time.Second, "Open", func() error {
					b, err := Open(path, &Options{Check: check, ReadOnly: ro, noSync: true})
					if err == nil {
						b.Close()
					}
					return err
				})
				assert.ErrorIs(t, err, ErrCorrupt, "page type %#x, Check %d, read-only %v", flags, check, ro)
			}
		}
	}
}

// soundPath writes soundFile's bytes (a clean stop's file, with claims
// pending) to a file and returns its path.
func soundPath(t *testing.T) string {
	t.Helper()
	path := t.TempDir() + "/sound.db"
	require.NoError(t, os.WriteFile(path, soundFile(t, true), 0o600))
	return path
}

// A records page whose first child is itself, in a file with a claim
// pending: Open marks the claim interrupted, reading its record through
// bbolt, and with CheckNever, which reads the records' pages unchecked,
// that read once recursed until the stack overflowed (an Open that never
// returned, in a sweep of damaged pages). Now the guard finds the cycle
// first: Open says ErrCorrupt. Each Open runs in a child process, which
// a hang or a crash cannot take this test down with.
func TestCheckNeverOpenOfACyclicRecordsPageIsCorrupt(t *testing.T) {
	path := recordsFile(t)
	b, err := Open(path, nil)
	require.NoError(t, err)
	_, won, err := b.Claim(context.Background(), backend.Record{Key: "in-flight", Token: "p", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	root := rootOf(t, path, "idem.records")
	require.Equal(t, uint16(branchPageFlag), binary.NativeEndian.Uint16(data[root*4096+8:]), "idem.records must have a branch root")
	binary.NativeEndian.PutUint64(data[root*4096+pageHeaderSize+8:], uint64(root)) // its first child: itself, where "in-flight" is looked for
	for _, mode := range []string{"skip", "clean"} {
		t.Run(mode, func(t *testing.T) {
			p, size := write(t, data)
			r := runChild(t, p, mode)
			judge(t, r, size)
			assert.Contains(t, r.stdout, "RESULT open: corrupt=true", "%s", r)
		})
	}
}

// An expiry branch whose last key is damaged upward, still in order: the
// keys of its last child are then below their branch's key, where a walk
// lists them and a search does not find them. A sweep listed them as due,
// its deletes found nothing, and it counted them swept, chunk after chunk
// (219 entries swept of 150): a Store's sweep, which goes on while a batch
// comes back full, could go round over enough of them. Now a page whose
// keys leave its branch's range is ErrCorrupt: at Open when it checks the
// whole file, else where a call meets it.
func TestMisplacedExpiryKeysAreCorrupt(t *testing.T) {
	data := soundFile(t, false)
	path := t.TempDir() + "/misplaced.db"
	require.NoError(t, os.WriteFile(path, data, 0o600))
	root := int(rootPage(t, path, bucketExpiry))
	off := root * os.Getpagesize()
	le := binary.NativeEndian
	require.Equal(t, uint16(branchPageFlag), le.Uint16(data[off+8:]), "idem.expiry must have a branch root")
	last := off + pageHeaderSize + (int(le.Uint16(data[off+10:]))-1)*elementSize
	data[last+int(le.Uint32(data[last:]))] = 0xff // the last element's key's first byte: later than any time
	for _, c := range []damageCase{
		{"stamped", data, CheckUnclean},
		{"stamped, CheckNever", data, CheckNever},
		{"unstamped", unstamped(t, data), CheckUnclean},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, c.data, 0o600))
			b, err := Open(path, &Options{Check: c.check, noSync: true})
			if err != nil {
				assert.ErrorIs(t, err, ErrCorrupt)
				return
			}
			defer b.Close()
			later := time.Now().Add(2 * time.Hour) // every entry is due
			n, err := b.Sweep(context.Background(), later, 1000)
			if err == nil {
				again, err2 := b.Sweep(context.Background(), later, 1000)
				t.Errorf("a sweep over misplaced keys saw no damage: %d entries swept of 150, then %d (%v)", n, again, err2)
				return
			}
			assert.ErrorIs(t, err, ErrCorrupt)
		})
	}
}
