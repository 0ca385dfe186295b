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

// readPage reads page id of r, a file of pgid pages of pageSize bytes,
// with its overflow pages, after checking its header: its own id, and its
// extent within the file. buf, if it holds a page, is used for a page
// without overflow.
func readPage(r io.ReaderAt, pageSize, pgid, id uint64, buf []byte) (p treePage, overflow uint64, err error) {
	if id < 2 || id >= pgid {
		return treePage{}, 0, fmt.Errorf("page %d: out of bounds (%d pages)", id, pgid)
	}
	if uint64(len(buf)) != pageSize {
		buf = make([]byte, pageSize)
	}
	if _, err := r.ReadAt(buf, int64(id*pageSize)); err != nil {
		return treePage{}, 0, fmt.Errorf("page %d: %w", id, err)
	}
	le := binary.NativeEndian
	overflow = uint64(le.Uint32(buf[12:]))
	switch {
	case le.Uint64(buf[0:]) != id:
		return treePage{}, 0, fmt.Errorf("page %d: says it is page %d", id, le.Uint64(buf[0:]))
	case id+overflow >= pgid:
		return treePage{}, 0, fmt.Errorf("page %d: %d overflow pages run past the end (%d pages)", id, overflow, pgid)
	}
	data := buf
	if overflow > 0 {
		data = make([]byte, (overflow+1)*pageSize)
		copy(data, buf)
		if _, err := r.ReadAt(data[pageSize:], int64((id+1)*pageSize)); err != nil {
			return treePage{}, 0, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return treePage{id: id, flags: le.Uint16(buf[8:]), count: int(le.Uint16(buf[10:])), data: data}, overflow, nil
}

// A treePage is a branch or leaf page of a bbolt B+tree, or a bucket's
// inline page (a leaf inside its parent's element), held in data. Its
// accessors read its elements as bbolt does; use them only on a page that
// check passed.
type treePage struct {
	id    uint64 // the page's id; an inline page's is its parent's
	flags uint16
	count int
	data  []byte
}

func (p treePage) branch() bool { return p.flags == branchPageFlag }

// elem returns the offset of element i.
func (p treePage) elem(i int) uint64 { return uint64(pageHeaderSize + i*elementSize) }

// key returns element i's key.
func (p treePage) key(i int) []byte {
	le, e := binary.NativeEndian, p.elem(i)
	if p.branch() {
		pos, ksize := uint64(le.Uint32(p.data[e:])), uint64(le.Uint32(p.data[e+4:]))
		return p.data[e+pos : e+pos+ksize]
	}
	pos, ksize := uint64(le.Uint32(p.data[e+4:])), uint64(le.Uint32(p.data[e+8:]))
	return p.data[e+pos : e+pos+ksize]
}

// child returns the page id that branch element i points to.
func (p treePage) child(i int) uint64 { return binary.NativeEndian.Uint64(p.data[p.elem(i)+8:]) }

// value returns leaf element i's value, and whether it is a bucket.
func (p treePage) value(i int) (v []byte, bucket bool) {
	le, e := binary.NativeEndian, p.elem(i)
	pos, ksize, vsize := uint64(le.Uint32(p.data[e+4:])), uint64(le.Uint32(p.data[e+8:])), uint64(le.Uint32(p.data[e+12:]))
	return p.data[e+pos+ksize : e+pos+ksize+vsize], le.Uint32(p.data[e:])&bucketLeafFlag != 0
}

// bucketRoot returns the root page id of the bucket held in leaf element
// i, or, for an inline bucket, 0 and its page.
func (p treePage) bucketRoot(i int) (root uint64, inline treePage) {
	v, _ := p.value(i)
	if root = binary.NativeEndian.Uint64(v); root != 0 {
		return root, treePage{}
	}
	in := v[inBucketSize:]
	le := binary.NativeEndian
	return 0, treePage{id: p.id, flags: le.Uint16(in[8:]), count: int(le.Uint16(in[10:])), data: in}
}

// check checks that p, in a file of pgid pages, is a page bbolt can
// search and walk without leaving it: a branch with at least one element,
// or a leaf; every element, key and value within the page; keys in
// ascending order (else a search misses them, and a walk could go round);
// a branch's children within the file, and not p itself; a bucket's
// value long enough for its header, and an inline bucket's page (a leaf,
// holding no bucket, as bbolt makes one) checked the same way. It reads
// nothing beyond p.
func (p treePage) check(pgid uint64, inline bool) error {
	switch {
	case p.flags != branchPageFlag && p.flags != leafPageFlag:
		return fmt.Errorf("page %d: type %#x where a branch or leaf page belongs", p.id, p.flags)
	case inline && p.flags != leafPageFlag:
		return fmt.Errorf("page %d: an inline bucket of type %#x, not a leaf", p.id, p.flags)
	case p.flags == branchPageFlag && p.count == 0:
		return fmt.Errorf("page %d: a branch with no elements", p.id)
	case pageHeaderSize+p.count*elementSize > len(p.data):
		return fmt.Errorf("page %d: %d elements do not fit in it", p.id, p.count)
	}
	le := binary.NativeEndian
	for i := range p.count {
		e := p.elem(i)
		if p.branch() {
			pos, ksize := uint64(le.Uint32(p.data[e:])), uint64(le.Uint32(p.data[e+4:]))
			if e+pos+ksize > uint64(len(p.data)) {
				return fmt.Errorf("page %d: branch element %d runs past the page", p.id, i)
			}
			if child := p.child(i); child < 2 || child >= pgid || child == p.id {
				return fmt.Errorf("page %d: branch element %d points to page %d (%d pages)", p.id, i, child, pgid)
			}
		} else {
			pos, ksize, vsize := uint64(le.Uint32(p.data[e+4:])), uint64(le.Uint32(p.data[e+8:])), uint64(le.Uint32(p.data[e+12:]))
			if e+pos+ksize+vsize > uint64(len(p.data)) {
				return fmt.Errorf("page %d: leaf element %d (key %d bytes, value %d) runs past the page", p.id, i, ksize, vsize)
			}
		}
		if i > 0 && bytes.Compare(p.key(i-1), p.key(i)) >= 0 {
			return fmt.Errorf("page %d: key %d is out of order", p.id, i)
		}
		if p.branch() {
			continue
		}
		v, bucket := p.value(i)
		switch {
		case !bucket:
			continue
		case inline:
			return fmt.Errorf("page %d: an inline bucket holds bucket %q", p.id, p.key(i))
		case len(v) < inBucketSize:
			return fmt.Errorf("page %d: bucket element %d too short", p.id, i)
		}
		root := le.Uint64(v)
		switch {
		case root == 0 && len(v) < inBucketSize+pageHeaderSize:
			return fmt.Errorf("page %d: inline bucket %d too short", p.id, i)
		case root == 0:
			if _, in := p.bucketRoot(i); in.check(pgid, true) != nil {
				return fmt.Errorf("page %d: inline bucket %q: %w", p.id, p.key(i), in.check(pgid, true))
			}
		case root < 2 || root >= pgid:
			return fmt.Errorf("page %d: bucket %q's root page %d is out of bounds (%d pages)", p.id, p.key(i), root, pgid)
		}
	}
	return nil
}

// errEmptyPage is the damage of a page with no elements below a bucket's
// root: bbolt removes such a page at the commit that empties it, and
// a cursor passes over it, so its elements were lost.
func errEmptyPage(id uint64) error {
	return fmt.Errorf("page %d: no elements, below its bucket's root", id)
}

// within checks that p's keys lie in [lo, hi) (a nil bound is none), the
// range its parent branch gives it: bbolt files a key under the last
// branch element whose key is at most the key, so a key outside its
// page's range is one that a search does not find, while a walk lists it
// (a sweep would delete it for ever, and never see it go).
func (p treePage) within(lo, hi []byte) error {
	switch {
	case p.count == 0:
		return nil
	case lo != nil && bytes.Compare(p.key(0), lo) < 0:
		return fmt.Errorf("page %d: key %q is below its branch's key %q", p.id, p.key(0), lo)
	case hi != nil && bytes.Compare(p.key(p.count-1), hi) >= 0:
		return fmt.Errorf("page %d: key %q is not below its branch's next key %q", p.id, p.key(p.count-1), hi)
	}
	return nil
}

// bounds returns the range of keys the child of branch element i may
// hold, in a branch whose own range is [lo, hi).
func (p treePage) bounds(i int, lo, hi []byte) (clo, chi []byte) {
	clo, chi = lo, hi
	if i > 0 {
		clo = p.key(i)
	}
	if i+1 < p.count {
		chi = p.key(i + 1)
	}
	return clo, chi
}

// verifier walks a file's pages from its meta: every page reachable once,
// within the file, every element within its page, and a freelist that
// names only pages that are within the file and not in use.
type verifier struct {
	r         io.ReaderAt
	m         meta
	reachable map[uint64]bool
	// only, if not nil, names the top-level buckets whose pages are
	// checked; the others' are not read (their inline pages, part of
	// the root bucket's, are).
	only [][]byte
}

// verifyFile checks the structure of the bbolt file r, whose newest meta is
// m, before bbolt reads it. It returns an error describing the first damage
// found. With only, it checks the root bucket's pages and those of the
// top-level buckets only names, and the freelist as far as they tell (a
// free page found in use among them).
func verifyFile(r io.ReaderAt, m meta, only ...[]byte) error {
	v := &verifier{r: r, m: m, reachable: map[uint64]bool{0: true, 1: true}, only: only}
	if err := v.tree(m.root, 0, true, true, nil, nil); err != nil {
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
func (v *verifier) page(id uint64) (treePage, error) {
	p, overflow, err := readPage(v.r, uint64(v.m.pageSize), v.m.pgid, id, nil)
	if err != nil {
		return treePage{}, err
	}
	for q := id; q <= id+overflow; q++ {
		if v.reachable[q] {
			return treePage{}, fmt.Errorf("page %d: reached twice", q)
		}
		v.reachable[q] = true
	}
	return p, nil
}

// tree checks the branch or leaf page id and everything under it; top
// says it is a page of the root bucket, whose elements are the top-level
// buckets, root that it is a bucket's root page, and [lo, hi) is the
// range of its keys.
func (v *verifier) tree(id uint64, depth int, top, root bool, lo, hi []byte) error {
	if depth > maxDepth {
		return fmt.Errorf("page %d: nested more than %d deep", id, maxDepth)
	}
	p, err := v.page(id)
	if err != nil {
		return err
	}
	if err := p.check(v.m.pgid, false); err != nil {
		return err
	}
	if !root && p.count == 0 {
		return errEmptyPage(id)
	}
	if err := p.within(lo, hi); err != nil {
		return err
	}
	for i := range p.count {
		if p.branch() {
			clo, chi := p.bounds(i, lo, hi)
			if err := v.tree(p.child(i), depth+1, top, false, clo, chi); err != nil {
				return err
			}
			continue
		}
		if _, bucket := p.value(i); !bucket || top && !v.checked(p.key(i)) {
			continue
		}
		if root, _ := p.bucketRoot(i); root != 0 {
			if err := v.tree(root, depth+1, false, true, nil, nil); err != nil {
				return err
			}
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
	p, err := v.page(id)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if p.flags != freelistPageFlag {
		return fmt.Errorf("freelist page %d: type %#x", id, p.flags)
	}
	count, data := p.count, p.data
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
