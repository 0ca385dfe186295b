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

// damageRecordsRoot gives the records bucket's root page another page's
// id, damage that only the whole-file check finds before bbolt trips on
// it: Open itself never reads that page.
func damageRecordsRoot(t *testing.T, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	var root uint64
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		root = uint64(tx.Bucket(bucketRecords).RootPage())
		return nil
	}))
	require.NoError(t, db.Close())
	require.NotZero(t, root, "the records bucket is inline: the test needs a page of its own")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(binary.NativeEndian.AppendUint64(nil, 0xdeadbeef), int64(root)*int64(os.Getpagesize()))
	require.NoError(t, err)
}

// opens reports how Open with check and a read-only Open with check take
// a copy of the file at path each.
func opens(t *testing.T, path string, check Check) (rw, ro error) {
	t.Helper()
	for i, opts := range []*Options{{Check: check}, {Check: check, ReadOnly: true}} {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		p := path + ".copy"
		require.NoError(t, os.WriteFile(p, data, 0o600))
		b, err := Open(p, opts)
		if err == nil {
			require.NoError(t, b.Close())
		}
		if i == 0 {
			rw = err
		} else {
			ro = err
		}
	}
	return rw, ro
}

// After a clean Close, Open does not read the whole file again: damage
// done to the closed file outside the pages Open reads goes unseen by the
// default, CheckUnclean, and is ErrCorrupt with CheckAlways. (That is the
// trade the option documents; "idem check" is the tool for a doubted file.)
func TestCleanStopSkipsTheWholeCheck(t *testing.T) {
	path := recordsFile(t)
	damageRecordsRoot(t, path)
	rw, ro := opens(t, path, CheckUnclean)
	assert.NoError(t, rw, "after a clean stop, Open read the whole file")
	assert.NoError(t, ro, "after a clean stop, a read-only Open read the whole file")
	rw, ro = opens(t, path, CheckAlways)
	assert.ErrorIs(t, rw, ErrCorrupt)
	assert.ErrorIs(t, ro, ErrCorrupt)
}

// After a SIGKILL, the default checks the whole file.
func TestUncleanStopChecksTheWholeFile(t *testing.T) {
	path := recordsFile(t)
	crashAt(t, path, "in-fn")
	damageRecordsRoot(t, path)
	rw, ro := opens(t, path, CheckUnclean)
	assert.ErrorIs(t, rw, ErrCorrupt)
	assert.ErrorIs(t, ro, ErrCorrupt)
}

// A file another program wrote after a clean Close is checked whole: its
// newest transaction is not the clean stop's mark.
func TestWriteAfterCleanStopChecksTheWholeFile(t *testing.T) {
	path := recordsFile(t)
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("operator"), []byte("was here"))
	}))
	require.NoError(t, db.Close())
	damageRecordsRoot(t, path)
	rw, ro := opens(t, path, CheckUnclean)
	assert.ErrorIs(t, rw, ErrCorrupt)
	assert.ErrorIs(t, ro, ErrCorrupt)
}

// A torn last commit (the clean stop's own meta page unreadable) leaves
// bbolt the meta before it, which is not the mark's: checked whole.
func TestTornCleanStopChecksTheWholeFile(t *testing.T) {
	path := recordsFile(t)
	damageRecordsRoot(t, path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	m0, err := readMetaAt(bytes.NewReader(data), 0)
	require.NoError(t, err)
	m1, err := readMetaAt(bytes.NewReader(data), int64(m0.pageSize))
	require.NoError(t, err)
	newest := 0
	if m1.txid > m0.txid {
		newest = int(m0.pageSize)
	}
	data[newest+pageHeaderSize+metaSumSize] ^= 0xff // its checksum
	require.NoError(t, os.WriteFile(path, data, 0o600))
	rw, ro := opens(t, path, CheckUnclean)
	assert.ErrorIs(t, rw, ErrCorrupt)
	assert.ErrorIs(t, ro, ErrCorrupt)
}

// After a clean stop, the pages Open reads through bbolt itself are
// still checked: the root bucket's and the meta and pending buckets'.
func TestCleanStopChecksWhatOpenReads(t *testing.T) {
	path := recordsFile(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	m, err := readMeta(bytes.NewReader(data))
	require.NoError(t, err)
	binary.NativeEndian.PutUint64(data[m.root*uint64(m.pageSize):], 0xdeadbeef) // the root bucket's page
	require.NoError(t, os.WriteFile(path, data, 0o600))
	rw, ro := opens(t, path, CheckUnclean)
	assert.ErrorIs(t, rw, ErrCorrupt)
	assert.ErrorIs(t, ro, ErrCorrupt)
}
