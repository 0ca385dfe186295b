package bolt

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"go.etcd.io/bbolt"
)

// A clean stop is stamped on the file's newest meta page, past the bytes
// bbolt uses of it (a page header and a 64-byte meta): Close writes, once
// its last commit is on disk and while it still holds the file's lock, the
// stamp's magic, that meta's transaction id, and a SHA-256 of the meta and
// of the freelist's pages, which Open could not otherwise check without
// reading every page, and which bbolt allocates from at its first commit.
// Close writes it through bbolt's own descriptor, so it lands on the file
// this process checked and holds, whatever is at the path by then. bbolt writes a meta
// page whole, the rest of the page zeroed, at every commit: the next commit
// to that slot erases the stamp, and one to the other slot makes a newer
// meta that bears none. So a stamp holds only if nothing has written the
// file since a clean Close: not a process killed or a machine that crashed
// with the file open, nor a torn last commit (bbolt falls back to the older
// meta, whose page its own commit wiped), nor another program's commit.
//
// Close stamps only a file that its Open checked in full or found stamped
// (Backend.verified), so a session opened with CheckNever cannot vouch for
// a file nobody checked. A change made to a closed file without a commit
// (bbolt's surgery on data pages, a failing disk) is damage to a closed
// file, which a stamped file's Open does not look for: the calls that read
// the damaged pages meet it, through the guard (guard.go), as ErrCorrupt.
// See Options.Check.
const stampAt = 512 // within the meta page; bbolt's meta ends at byte 80

var stampMagic = []byte("idem:clean-stop\x00")

// stampLen is the stamp's size: magic, transaction id, freelist digest.
const stampLen = 16 + 8 + sha256.Size

// stamp writes the clean-stop stamp on the newest meta page of f, the file
// bbolt holds open and locked, and syncs it.
func stamp(f *os.File) error {
	m, err := readMeta(f)
	if err != nil {
		return err
	}
	if m.pageSize < stampAt+stampLen {
		return nil
	}
	sum, err := stampSum(f, m)
	if err != nil {
		return err
	}
	buf := append(bytes.Clone(stampMagic), binary.BigEndian.AppendUint64(nil, m.txid)...)
	if _, err := f.WriteAt(append(buf, sum[:]...), m.at+stampAt); err != nil {
		return err
	}
	return f.Sync()
}

// stamped reports whether the newest meta m of the file r bears a stamp
// that still holds: its transaction, and the freelist it left.
func stamped(r io.ReaderAt, m meta) bool {
	if m.freelist == noFreelist || m.pageSize < stampAt+stampLen {
		return false
	}
	var got [stampLen]byte
	if _, err := r.ReadAt(got[:], m.at+stampAt); err != nil {
		return false
	}
	sum, err := stampSum(r, m)
	return err == nil && bytes.Equal(got[:16], stampMagic) &&
		binary.BigEndian.Uint64(got[16:]) == m.txid && bytes.Equal(got[24:], sum[:])
}

// stampSum is the SHA-256 of the meta m (all of its fields, so that a meta
// rewritten with another root or page count, as bbolt's surgery tool can,
// is not taken for the stamped one) and of the freelist's pages, their
// overflow pages included.
func stampSum(r io.ReaderAt, m meta) ([sha256.Size]byte, error) {
	var hdr [pageHeaderSize]byte
	ps := int64(m.pageSize)
	if _, err := r.ReadAt(hdr[:], int64(m.freelist)*ps); err != nil {
		return [sha256.Size]byte{}, err
	}
	overflow := uint64(binary.NativeEndian.Uint32(hdr[12:]))
	if m.freelist+overflow >= m.pgid {
		return [sha256.Size]byte{}, fmt.Errorf("freelist page %d: %d overflow pages run past the end", m.freelist, overflow)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, m.at+pageHeaderSize, metaSize)); err != nil {
		return [sha256.Size]byte{}, err
	}
	if _, err := io.Copy(h, io.NewSectionReader(r, int64(m.freelist)*ps, int64(overflow+1)*ps)); err != nil {
		return [sha256.Size]byte{}, err
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

// nothingPending reports whether the file holds no claim left pending, so
// that Open reads no record through bbolt: a clean stop's shortcut is only
// for such a file, since the pages of the records it would read are not
// checked.
func nothingPending(db *bbolt.DB) (none bool, err error) {
	err = view(db, func(tx *bbolt.Tx) error {
		p := tx.Bucket(bucketPending)
		none = p == nil
		if p != nil {
			k, _ := p.Cursor().First()
			none = k == nil
		}
		return nil
	})
	return none, err
}
