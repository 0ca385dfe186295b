package bolt

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordsFile writes a file with enough records that they live in leaf
// pages of their own, and returns its path.
func recordsFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	b, err := Open(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 200 {
		rec := backend.Record{Key: fmt.Sprintf("key-%03d", i), Token: "t", State: backend.StatePending}
		_, _, err := b.Claim(ctx, rec, time.Now(), 0)
		require.NoError(t, err)
		rec.Value = []byte(strings.Repeat("v", 100))
		require.NoError(t, b.Complete(ctx, rec, time.Now(), time.Hour))
	}
	require.NoError(t, b.Close())
	return path
}

// setValueSize rewrites the size bbolt's leaf page element gives key's
// value, as one damaged byte would.
func setValueSize(t *testing.T, path, key string, size uint32) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	pageSize := os.Getpagesize()
	le := binary.LittleEndian
	for off := 0; off+pageHeaderSize <= len(data); off += pageSize {
		if le.Uint16(data[off+8:]) != 0x02 { // a leaf page
			continue
		}
		count := int(le.Uint16(data[off+10:]))
		for i := range count {
			e := off + pageHeaderSize + i*16
			pos, ksize := int(le.Uint32(data[e+4:])), int(le.Uint32(data[e+8:]))
			if e+pos+ksize <= len(data) && string(data[e+pos:e+pos+ksize]) == key {
				le.PutUint32(data[e+12:], size)
				require.NoError(t, os.WriteFile(path, data, 0o600))
				return
			}
		}
	}
	t.Fatalf("no leaf element for %q", key)
}

// A damaged value size in a record's page (seen by fuzzing: a file that
// then hung its first RunOnce and grew to gigabytes, or made Sweep try to
// allocate 2 GB) is ErrCorrupt within a second, and the file does not grow.
func TestDamagedValueSizeIsCorrupt(t *testing.T) {
	for _, size := range []uint32{0x7f000000, 0x64000064, 1 << 30} {
		t.Run(fmt.Sprintf("%#x", size), func(t *testing.T) {
			path := recordsFile(t)
			setValueSize(t, path, "key-100", size)
			before, err := os.Stat(path)
			require.NoError(t, err)

			done := make(chan error, 1)
			go func() {
				b, err := Open(path, &Options{Check: CheckAlways})
				if err == nil {
					s := idem.New[string](idem.Options{Backend: b})
					_, err = s.RunOnce(context.Background(), "key-100", nil, func(context.Context) (string, error) { return "ran", nil })
					if err == nil {
						_, err = s.Sweep(context.Background())
					}
					s.Close()
					b.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, ErrCorrupt)
			case <-time.After(5 * time.Second):
				t.Fatal("a damaged value size hung the store")
			}
			after, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, before.Size(), after.Size(), "the file grew")
		})
	}
}

// A page that claims another page's id fails bbolt's own assertion: Open
// reports ErrCorrupt, on its own goroutine, rather than crash the process
// (bbolt's tx.Check would panic on a goroutine of its own).
func TestPageWithAWrongIDIsCorrupt(t *testing.T) {
	path := recordsFile(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	pageSize := os.Getpagesize()
	damaged := false
	for off := 2 * pageSize; off+pageHeaderSize <= len(data); off += pageSize {
		if binary.LittleEndian.Uint16(data[off+8:]) == 0x02 { // a leaf page
			binary.LittleEndian.PutUint64(data[off:], 0xdeadbeef)
			damaged = true
			break
		}
	}
	require.True(t, damaged)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	_, err = Open(path, &Options{Check: CheckAlways})
	assert.ErrorIs(t, err, ErrCorrupt)
	_, err = Open(path, &Options{ReadOnly: true, Check: CheckAlways})
	assert.ErrorIs(t, err, ErrCorrupt)
}
