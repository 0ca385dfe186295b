package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// damageRecordsRoot gives the records bucket's root page another page's
// id, damage that only the whole-file check finds before bbolt trips on
// it: Open itself never reads that page, unless a claim is pending.
func damageRecordsRoot(t *testing.T, path string) { damageRoot(t, path, bucketRecords) }

// rootPage is the page id of bucket's root.
func rootPage(t *testing.T, path string, bucket []byte) uint64 {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	var root uint64
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		root = uint64(tx.Bucket(bucket).RootPage())
		return nil
	}))
	require.NotZero(t, root, "bucket %s is inline: the test needs a page of its own", bucket)
	return root
}

// damageRoot gives bucket's root page another page's id.
func damageRoot(t *testing.T, path string, bucket []byte) {
	t.Helper()
	root := rootPage(t, path, bucket)
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

// refusedByDefault asserts that Open and a read-only Open, with the
// default CheckUnclean, each refuse a copy of the file at path as corrupt.
func refusedByDefault(t *testing.T, path string) {
	t.Helper()
	rw, ro := opens(t, path, CheckUnclean)
	assert.ErrorIs(t, rw, ErrCorrupt, "Open")
	assert.ErrorIs(t, ro, ErrCorrupt, "a read-only Open")
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
	refusedByDefault(t, path)
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
	refusedByDefault(t, path)
}

// A torn last commit (the stamped meta page unreadable) leaves bbolt the
// meta before it, whose page bears no stamp, its own commit having written
// it whole: the file is checked in full, and opens as that meta left it.
func TestTornCleanStopIsNotStamped(t *testing.T) {
	path := recordsFile(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	newest, err := readMeta(bytes.NewReader(data))
	require.NoError(t, err)
	require.True(t, stamped(bytes.NewReader(data), newest), "a clean Close stamps its newest meta")
	data[newest.at+pageHeaderSize+metaSumSize] ^= 0xff // its checksum
	m, err := readMeta(bytes.NewReader(data))
	require.NoError(t, err)
	require.Less(t, m.txid, newest.txid, "bbolt's fallback is the older meta")
	assert.False(t, stamped(bytes.NewReader(data), m), "the older meta bears a stamp")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	rw, ro := opens(t, path, CheckUnclean)
	assert.NoError(t, rw, "the older meta's file is whole")
	assert.NoError(t, ro)
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
	refusedByDefault(t, path)
}

// A claim pending at a clean Close (work in flight at shutdown) makes
// Open read its record through bbolt: such a file is checked in full.
// (Unchecked, a records page pointing at itself overflowed bbolt's stack
// and crashed the process here.)
func TestCleanStopWithPendingClaimChecksTheWholeFile(t *testing.T) {
	path := recordsFile(t)
	b, err := Open(path, nil)
	require.NoError(t, err)
	_, won, err := b.Claim(context.Background(), backend.Record{Key: "in-flight", Token: "p", State: backend.StatePending}, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	require.NoError(t, b.Close())
	damageRecordsRoot(t, path)
	refusedByDefault(t, path)
}

// A freelist damaged after a clean Close (it names a live page, which the
// first commit would write over: records lost, keys run again) fails the
// stamp's digest, and the whole check refuses the file.
func TestCleanStopWithDamagedFreelistChecksTheWholeFile(t *testing.T) {
	path := recordsFile(t)
	live := rootPage(t, path, bucketRecords)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	m, err := readMeta(bytes.NewReader(data))
	require.NoError(t, err)
	require.NotEqual(t, uint64(noFreelist), m.freelist)
	off := m.freelist * uint64(m.pageSize)
	binary.NativeEndian.PutUint16(data[off+10:], 1)    // one free page,
	binary.NativeEndian.PutUint64(data[off+16:], live) // and it is in use
	require.NoError(t, os.WriteFile(path, data, 0o600))
	refusedByDefault(t, path)
}

// A session opened with CheckNever vouches for nothing: its Close does
// not stamp the file, so the next default Open checks it in full.
func TestCheckNeverDoesNotStampTheFile(t *testing.T) {
	path := recordsFile(t)
	crashAt(t, path, "in-fn")
	damageRoot(t, path, bucketExpiry)
	b, err := Open(path, &Options{Check: CheckNever})
	require.NoError(t, err, "CheckNever, and Open reads nothing of the expiry index")
	require.NoError(t, b.Close())
	refusedByDefault(t, path)
}

// The stamp is on the newest meta page only until the next commit: a
// writer's Open (it marks nothing here, but commits its buckets' check)
// and a clean Close stamp again, and a commit by another program erases it.
func TestStampHoldsOnlyUntilTheNextCommit(t *testing.T) {
	path := recordsFile(t)
	stampedNow := func() bool {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		m, err := readMeta(f)
		require.NoError(t, err)
		return stamped(f, m)
	}
	require.True(t, stampedNow(), "a clean Close stamps the file")
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("operator"), []byte("was here"))
	}))
	require.NoError(t, db.Close())
	assert.False(t, stampedNow(), "a commit left the stamp standing")
}
