package bolt

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// aDatabase returns the path of a closed idem database holding a few
// thousand records, so that it spans many pages.
func aDatabase(t *testing.T) string {
	t.Helper()
	b, path := openTemp(t, &Options{noSync: true})
	s := idem.New[receipt](idem.Options{Backend: b})
	runKeys(t, s, 0, 3000, 8, func(k int) string { return filepath.Join("key", string(rune('a'+k%26)), time.Duration(k).String()) })
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())
	return path
}

func TestOpenRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	good := aDatabase(t)
	data, err := os.ReadFile(good)
	require.NoError(t, err)
	require.Greater(t, len(data), 3*4096)

	scrambled := append([]byte(nil), data...) // valid meta pages, garbage everywhere else
	for i := 2 * 4096; i < len(scrambled); i++ {
		scrambled[i] = byte(i*31 + 7)
	}

	flipped := append([]byte(nil), data...)
	flipped[16+20] ^= 0xff // first meta page, inside its checksummed fields
	flipped[4096+16+20] ^= 0xff

	foreign := filepath.Join(dir, "foreign.db")
	db, err := bbolt.Open(foreign, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("users")); return err }))
	require.NoError(t, db.Close())

	for _, tc := range []struct {
		name string
		path string
		is   error  // sentinel the error must match, if any
		says string // text the message must hold
	}{
		{"garbage bytes", write("garbage.db", garbage), nil, "not a bbolt database"},
		{"a few bytes", write("short.db", []byte("hello")), nil, "not a bbolt database"},
		{"truncated database", write("truncated.db", data[:len(data)/3]), ErrCorrupt, "truncated"},
		{"both meta pages corrupt", write("flipped.db", flipped), nil, "checksum"},
		{"garbage data pages", write("scrambled.db", scrambled), ErrCorrupt, "corrupt"},
		{"a directory", dir, nil, "is a directory"},
		{"another application's bbolt file", foreign, ErrNotIdem, `"users"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Open(tc.path, nil)
			if b != nil {
				b.Close()
			}
			require.Error(t, err)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			assert.Contains(t, err.Error(), tc.says)
		})
	}
}

func TestOpenLockedFileFailsInBoundedTime(t *testing.T) {
	_, path := openTemp(t, nil)
	start := time.Now()
	b, err := Open(path, &Options{LockTimeout: 100 * time.Millisecond})
	if b != nil {
		b.Close()
	}
	assert.ErrorIs(t, err, ErrLocked)
	assert.Less(t, time.Since(start), 5*time.Second)

	_, err = Open(path, &Options{LockTimeout: -1})
	assert.ErrorIs(t, err, ErrLocked, "a negative timeout fails at once")
}

func TestClosedBackend(t *testing.T) {
	b, _ := openTemp(t, nil)
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	ctx := context.Background()
	_, _, err := b.Claim(ctx, backend.Record{Key: "k", State: backend.StatePending}, time.Now(), time.Minute)
	assert.ErrorIs(t, err, idem.ErrClosed)
	_, _, err = b.Get(ctx, "k", time.Now())
	assert.ErrorIs(t, err, idem.ErrClosed)
}
