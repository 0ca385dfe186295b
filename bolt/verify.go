package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// bbolt's page layout (go.etcd.io/bbolt/internal/common), read here from
// the file itself, never through bbolt: a damaged page must not reach
// bbolt's code, which trusts it (it loops on a cycle, recurses without end
// on a bucket that contains itself, allocates what a size field says, and
// asserts on goroutines of its own).
const (
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	elementSize      = 16 // branch: pos, ksize uint32, pgid uint64; leaf: flags, pos, ksize, vsize uint32
	inBucketSize     = 16 // root pgid, sequence uint64
	maxDepth         = 64 // of branch pages and nested buckets together
)

// verifier walks a file's pages from its meta: every page reachable once,
// within the file, every element within its page, and a freelist that
// names only pages that are within the file and not in use.
type verifier struct {
	r         io.ReaderAt
	m         meta
	reachable map[uint64]bool
	// only, if not nil, names the top-level buckets whose pages are
	// checked; the others' are not read.
	only [][]byte
}

// verifyFile checks the structure of the bbolt file r, whose newest meta is
// m, before bbolt reads it. It returns an error describing the first damage
// found. With only, it checks the root bucket's pages and those of the
// top-level buckets only names, and the freelist as far as they tell (a
// free page found in use among them).
func verifyFile(r io.ReaderAt, m meta, only ...[]byte) error {
	v := &verifier{r: r, m: m, reachable: map[uint64]bool{0: true, 1: true}, only: only}
	if err := v.tree(m.root, 0, true); err != nil {
		return err
	}
	return v.freelist()
}

// checked reports whether the top-level bucket name is to be checked.
func (v *verifier) checked(name []byte) bool {
	if v.only == nil {
		return true
	}
	for _, o := range v.only {
		if bytes.Equal(o, name) {
			return true
		}
	}
	return false
}

// page reads page id and its overflow pages, marking them reachable.
func (v *verifier) page(id uint64) (flags uint16, count int, data []byte, err error) {
	if id < 2 || id >= v.m.pgid {
		return 0, 0, nil, fmt.Errorf("page %d: out of bounds (%d pages)", id, v.m.pgid)
	}
	ps := uint64(v.m.pageSize)
	var hdr [pageHeaderSize]byte
	if _, err := v.r.ReadAt(hdr[:], int64(id*ps)); err != nil {
		return 0, 0, nil, fmt.Errorf("page %d: %w", id, err)
	}
	le := binary.NativeEndian
	overflow := uint64(le.Uint32(hdr[12:]))
	switch {
	case le.Uint64(hdr[0:]) != id:
		return 0, 0, nil, fmt.Errorf("page %d: says it is page %d", id, le.Uint64(hdr[0:]))
	case id+overflow >= v.m.pgid:
		return 0, 0, nil, fmt.Errorf("page %d: %d overflow pages run past the end (%d pages)", id, overflow, v.m.pgid)
	}
	for p := id; p <= id+overflow; p++ {
		if v.reachable[p] {
			return 0, 0, nil, fmt.Errorf("page %d: reached twice", p)
		}
		v.reachable[p] = true
	}
	data = make([]byte, (overflow+1)*ps)
	if _, err := v.r.ReadAt(data, int64(id*ps)); err != nil {
		return 0, 0, nil, fmt.Errorf("page %d: %w", id, err)
	}
	return le.Uint16(hdr[8:]), int(le.Uint16(hdr[10:])), data, nil
}

// tree checks the branch or leaf page id and everything under it; top
// says it is a page of the root bucket, whose elements are the top-level
// buckets.
func (v *verifier) tree(id uint64, depth int, top bool) error {
	if depth > maxDepth {
		return fmt.Errorf("page %d: nested more than %d deep", id, maxDepth)
	}
	flags, count, data, err := v.page(id)
	if err != nil {
		return err
	}
	return v.elements(id, flags, count, data, depth, top)
}

// elements checks the elements of a branch or leaf page held in data (a
// page of the file, or a bucket's inline page).
func (v *verifier) elements(id uint64, flags uint16, count int, data []byte, depth int, top bool) error {
	le := binary.NativeEndian
	if pageHeaderSize+count*elementSize > len(data) {
		return fmt.Errorf("page %d: %d elements do not fit in it", id, count)
	}
	var prev []byte // keys must ascend, or lookups miss them
	ordered := func(i int, key []byte) error {
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			return fmt.Errorf("page %d: key %d is out of order", id, i)
		}
		prev = key
		return nil
	}
	for i := range count {
		e := pageHeaderSize + i*elementSize
		switch flags {
		case branchPageFlag:
			pos, ksize := uint64(le.Uint32(data[e:])), uint64(le.Uint32(data[e+4:]))
			if uint64(e)+pos+ksize > uint64(len(data)) {
				return fmt.Errorf("page %d: branch element %d runs past the page", id, i)
			}
			if err := ordered(i, data[uint64(e)+pos:uint64(e)+pos+ksize]); err != nil {
				return err
			}
			if err := v.tree(le.Uint64(data[e+8:]), depth+1, top); err != nil {
				return err
			}
		case leafPageFlag:
			eflags, pos, ksize, vsize := le.Uint32(data[e:]), uint64(le.Uint32(data[e+4:])), uint64(le.Uint32(data[e+8:])), uint64(le.Uint32(data[e+12:]))
			if uint64(e)+pos+ksize+vsize > uint64(len(data)) {
				return fmt.Errorf("page %d: leaf element %d (key %d bytes, value %d) runs past the page", id, i, ksize, vsize)
			}
			if err := ordered(i, data[uint64(e)+pos:uint64(e)+pos+ksize]); err != nil {
				return err
			}
			if eflags&bucketLeafFlag == 0 || top && !v.checked(data[uint64(e)+pos:uint64(e)+pos+ksize]) {
				continue
			}
			value := data[uint64(e)+pos+ksize : uint64(e)+pos+ksize+vsize]
			if len(value) < inBucketSize {
				return fmt.Errorf("page %d: bucket element %d too short", id, i)
			}
			if root := le.Uint64(value); root != 0 {
				if err := v.tree(root, depth+1, false); err != nil {
					return err
				}
				continue
			}
			inline := value[inBucketSize:] // an inline bucket: a leaf page in the value
			if len(inline) < pageHeaderSize {
				return fmt.Errorf("page %d: inline bucket %d too short", id, i)
			}
			if depth+1 > maxDepth {
				return fmt.Errorf("page %d: nested more than %d deep", id, maxDepth)
			}
			if err := v.elements(id, le.Uint16(inline[8:]), int(le.Uint16(inline[10:])), inline, depth+1, false); err != nil {
				return err
			}
		default:
			return fmt.Errorf("page %d: type %#x where a branch or leaf page belongs", id, flags)
		}
	}
	return nil
}

// freelist checks that the free pages are within the file, listed once,
// and none of them in use.
func (v *verifier) freelist() error {
	if v.m.freelist == noFreelist {
		return nil
	}
	id := v.m.freelist
	flags, count, data, err := v.page(id)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if flags != freelistPageFlag {
		return fmt.Errorf("freelist page %d: type %#x", id, flags)
	}
	le := binary.NativeEndian
	start, n := pageHeaderSize, uint64(count)
	if count == 0xFFFF { // the count is the first id's slot
		if len(data) < pageHeaderSize+8 {
			return fmt.Errorf("freelist page %d: too short", id)
		}
		n, start = le.Uint64(data[pageHeaderSize:]), pageHeaderSize+8
	}
	if n > uint64(len(data)-start)/8 || n > v.m.pgid {
		return fmt.Errorf("freelist page %d: counts %d free pages", id, n)
	}
	seen := make(map[uint64]bool, n)
	for i := range n {
		free := le.Uint64(data[uint64(start)+8*i:])
		switch {
		case free < 2 || free >= v.m.pgid:
			return fmt.Errorf("freelist page %d: free page %d is out of bounds", id, free)
		case v.reachable[free]:
			return fmt.Errorf("freelist page %d: free page %d is in use", id, free)
		case seen[free]:
			return fmt.Errorf("freelist page %d: free page %d listed twice", id, free)
		}
		seen[free] = true
	}
	return nil
}
