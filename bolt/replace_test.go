package bolt

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// Close stamps the file bbolt holds, not whatever is at the path by then:
// a damaged, unclean file renamed into place during the session (an
// operator restoring a backup) is not stamped clean by another file's
// Close.
func TestStampGoesToTheOpenFileNotThePath(t *testing.T) {
	path := recordsFile(t)
	other := recordsFile(t)
	db, err := bbolt.Open(other, 0o600, nil) // another program's commit: not stamped
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("operator"), []byte("was here"))
	}))
	require.NoError(t, db.Close())
	damageRecordsRoot(t, other)
	rw, _ := opens(t, other, CheckUnclean)
	require.ErrorIs(t, rw, ErrCorrupt, "the unclean file is refused")

	b, err := Open(path, nil)
	require.NoError(t, err)
	require.NoError(t, os.Rename(other, path))
	require.NoError(t, b.Close())
	b, err = Open(path, nil)
	if err == nil {
		b.Close()
	}
	assert.ErrorIs(t, err, ErrCorrupt, "the file renamed in was stamped by the Close of the one it replaced")
}

// A file replaced between Open's check and bbolt's opening of it, by one
// with the same transaction id and a freelist that names a live page, is
// not opened unchecked: Open sees bbolt holds another file and checks
// again. (Unchecked, even CheckAlways opened it, its first commit wrote
// over the records, and its Close stamped it.)
func TestFileReplacedBetweenCheckAndOpen(t *testing.T) {
	path := recordsFile(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	live := rootPage(t, path, bucketRecords)
	m, err := readMeta(bytes.NewReader(data))
	require.NoError(t, err)
	off := m.freelist * uint64(m.pageSize)
	binary.NativeEndian.PutUint16(data[off+10:], 1)    // one free page,
	binary.NativeEndian.PutUint64(data[off+16:], live) // and it is in use
	swap := path + ".restored"
	require.NoError(t, os.WriteFile(swap, data, 0o600)) // the same transaction id
	for _, check := range []Check{CheckAlways, CheckUnclean} {
		require.NoError(t, os.WriteFile(swap, data, 0o600))
		testHookAfterCheck = func() {
			testHookAfterCheck = nil
			require.NoError(t, os.Rename(swap, path))
		}
		b, err := Open(path, &Options{Check: check})
		testHookAfterCheck = nil
		if err == nil {
			b.Close()
		}
		assert.ErrorIs(t, err, ErrCorrupt, "Check %d opened a file it never checked", check)
	}
}
