package bolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"

	"github.com/seed094d4201/idem"
	"go.etcd.io/bbolt"
)

// bbolt's on-disk constants (go.etcd.io/bbolt/internal/common).
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16 // id uint64, flags uint16, count uint16, overflow uint32
	metaSize       = 64 // magic, version, pageSize, flags uint32; root, sequence, freelist, pgid, txid, checksum uint64
	metaSumSize    = 56 // the checksum covers the meta up to the checksum itself
	noFreelist     = 0xffffffffffffffff
)

// meta is what checkFile needs of a bbolt meta page.
type meta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64 // high-water mark: pages the file must hold
	txid     uint64
	at       int64 // the offset of the meta's page in the file
}

// checkFile refuses, with a clear error, a file that bbolt could not open
// safely. bbolt maps the file and trusts its meta pages: a file truncated
// below the pages they claim faults with SIGBUS on first access, and a
// corrupt meta can panic. A missing or empty file is fine: Open creates it.
//
// It also verifies the file's structure page by page (verify.go), as far
// as scope says, before bbolt reads those pages, and reports whether it
// verified all of them, and the meta it checked from. f, if not nil, is
// the file at path, opened (and locked) by the caller; else checkFile
// opens path itself.
func checkFile(path string, scope scope, f *os.File) (m meta, checkedAll bool, err error) {
	var fi os.FileInfo
	if f != nil {
		fi, err = f.Stat()
	} else {
		fi, err = os.Stat(path)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return meta{}, false, nil
	case err != nil:
		return meta{}, false, err
	case fi.IsDir():
		return meta{}, false, fmt.Errorf("bolt: %s is a directory, not a database file", path)
	case !fi.Mode().IsRegular():
		return meta{}, false, fmt.Errorf("bolt: %s is not a regular file", path)
	case fi.Size() == 0:
		return meta{}, false, nil
	}
	if f == nil {
		if f, err = os.Open(path); err != nil {
			return meta{}, false, err
		}
		defer f.Close()
	}

	m, err = readMeta(f)
	switch {
	case errors.Is(err, errNoMagic):
		return meta{}, false, fmt.Errorf("bolt: %s is not a bbolt database: %w", path, err)
	case err != nil:
		return meta{}, false, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	if m.pgid > uint64(fi.Size())/uint64(m.pageSize) { // pgid*pageSize could overflow
		return meta{}, false, fmt.Errorf("%w: %s is truncated: %d bytes, but its meta page counts %d pages of %d", ErrCorrupt, path, fi.Size(), m.pgid, m.pageSize)
	}
	if m.txid > 1<<62 { // the next commit's id would wrap, and bbolt would free pages in use
		return meta{}, false, fmt.Errorf("%w: %s: implausible transaction id %d", ErrCorrupt, path, m.txid)
	}
	if m.root >= m.pgid || (m.freelist >= m.pgid && m.freelist != noFreelist) {
		return meta{}, false, fmt.Errorf("%w: %s: meta page points past the end of the file", ErrCorrupt, path)
	}
	if scope == scopeOpen && !stamped(f, m) {
		// Not a clean stop's file, or not as that stop left it (clean.go).
		scope = scopeAll
	}
	var err2 error
	if scope == scopeAll {
		err2 = verifyFile(f, m)
	} else {
		err2 = verifyFile(f, m, bucketMeta, bucketPending)
	}
	if err2 != nil {
		return meta{}, false, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err2)
	}
	return m, scope == scopeAll, nil
}

// A scope is how much of a file checkFile verifies.
type scope int

const (
	// scopeReads: the meta pages, the file's size against them, and the
	// pages Open reads through bbolt (the root bucket, the meta and
	// pending buckets) and the freelist's bounds. What bbolt reads of
	// the other buckets later, a guard checks as it goes (guard.go).
	scopeReads scope = iota
	// scopeOpen: scopeReads if the file bears a clean stop's stamp
	// (clean.go), else scopeAll.
	scopeOpen
	// scopeAll: and every page in use.
	scopeAll
)

// errNoMagic is returned by readMeta for a file that does not start like a
// bbolt database at all.
var errNoMagic = errors.New("no bbolt magic number")

// readMeta returns the newest valid meta page of the two bbolt keeps: the
// first at offset 0, the second one page in. When the first is unreadable,
// the second is looked for where bbolt itself looks: one OS page in.
func readMeta(r io.ReaderAt) (meta, error) {
	first, err0 := readMetaAt(r, 0)
	at := int64(os.Getpagesize())
	if err0 == nil {
		at = int64(first.pageSize)
	}
	second, err1 := readMetaAt(r, at)
	switch {
	case err0 != nil && err1 != nil:
		return meta{}, err0
	case err0 != nil:
		return second, nil
	case err1 != nil || first.txid >= second.txid:
		return first, nil
	}
	return second, nil
}

func readMetaAt(r io.ReaderAt, off int64) (meta, error) {
	var buf [pageHeaderSize + metaSize]byte
	if _, err := r.ReadAt(buf[:], off); err != nil {
		if off == 0 {
			return meta{}, fmt.Errorf("%w: file too short: %w", errNoMagic, err)
		}
		return meta{}, fmt.Errorf("reading meta page at %d: %w", off, err)
	}
	b := buf[pageHeaderSize:]
	le := binary.NativeEndian // bbolt writes its meta in the machine's byte order
	switch {
	case le.Uint32(b[0:]) != boltMagic:
		return meta{}, errNoMagic
	case le.Uint32(b[4:]) != boltVersion:
		return meta{}, fmt.Errorf("bbolt file format %d, want %d", le.Uint32(b[4:]), boltVersion)
	}
	h := fnv.New64a()
	h.Write(b[:metaSumSize])
	if h.Sum64() != le.Uint64(b[metaSumSize:]) {
		return meta{}, errors.New("meta page checksum mismatch")
	}
	m := meta{
		at:       off,
		pageSize: le.Uint32(b[8:]),
		root:     le.Uint64(b[16:]),
		freelist: le.Uint64(b[32:]),
		pgid:     le.Uint64(b[40:]),
		txid:     le.Uint64(b[48:]),
	}
	if m.pageSize < 512 || m.pageSize&(m.pageSize-1) != 0 {
		return meta{}, fmt.Errorf("implausible page size %d", m.pageSize)
	}
	return m, nil
}

// MaxRecordSize bounds a record in the file: a record claiming more is
// damage, refused with ErrCorrupt before it is read, since a corrupt size
// could otherwise make a read allocate gigabytes, or a write copy them
// back and grow the file without bound.
const MaxRecordSize = 64 << 20

// checkRecords checks, in a file whose structure verifyFile passed, that
// idem's buckets hold no nested buckets and that no record claims more than
// MaxRecordSize. A record whose bytes do not decode is not the file's
// damage but the key's: using the key reports ErrCorrupt, and Forget clears
// it (idem check reports it).
func checkRecords(db *bbolt.DB) error {
	return view(db, func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketExpiry, bucketPending} {
			if b := tx.Bucket(name); b != nil {
				c, w := b.Cursor(), newWalk(tx, name)
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if err := w.step(k); err != nil {
						return err
					}
					if v == nil {
						return fmt.Errorf("%w: %q in bucket %s is a bucket", ErrCorrupt, k, name)
					}
				}
			}
		}
		records := tx.Bucket(bucketRecords)
		if records == nil {
			return nil // a new file, or not idem's: Open says which
		}
		limit := min(int64(MaxRecordSize), tx.Size())
		c, w := records.Cursor(), newWalk(tx, bucketRecords)
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if err := w.step(k); err != nil {
				return err
			}
			if int64(len(k))+int64(len(v)) > limit {
				return fmt.Errorf("%w: record %q claims %d bytes in a file of %d", ErrCorrupt, k, len(v), tx.Size())
			}
			if v == nil {
				return fmt.Errorf("%w: %q in the records bucket is a bucket", ErrCorrupt, k)
			}
			if idem.CheckKey(string(k)) != nil { // idem writes no such key: a damaged offset reads the wrong bytes
				return fmt.Errorf("%w: the records bucket holds key %q, which idem never writes", ErrCorrupt, k)
			}
			// A record names its key (version, state, key length, key): a
			// damaged key offset files it under another key, and the key it
			// names would then be claimed afresh.
			if len(v) >= 3 && (v[0] >= 1 && v[0] <= 3) && 3+int(v[2]) <= len(v) && !bytes.Equal(v[3:3+int(v[2])], k) {
				return fmt.Errorf("%w: the record stored under %q names key %q", ErrCorrupt, k, v[3:3+int(v[2])])
			}
		}
		return nil
	})
}

// A walk bounds a cursor's walk over a bucket of a file that may be
// damaged: a page that points back into the walk would make it go round
// for ever. Keys come in strictly increasing order, and no file holds more
// entries than it has room for (each takes a 16-byte element header), so
// a key out of order, or one entry too many, is damage.
type walk struct {
	name []byte
	prev []byte
	n    int64
	max  int64
}

func newWalk(tx *bbolt.Tx, name []byte) *walk {
	return &walk{name: name, max: tx.Size()/16 + 1}
}

func (w *walk) step(k []byte) error {
	w.n++
	switch {
	case w.n > w.max:
		return fmt.Errorf("%w: bucket %s lists more entries than the file can hold", ErrCorrupt, w.name)
	case w.prev != nil && bytes.Compare(k, w.prev) <= 0:
		return fmt.Errorf("%w: bucket %s lists key %q after %q, out of order", ErrCorrupt, w.name, k, w.prev)
	}
	w.prev = append(w.prev[:0], k...)
	return nil
}
