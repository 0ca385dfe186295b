package bolt

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"

	bbolt "go.etcd.io/bbolt"
)

// A guard reads ahead of bbolt in a file that Open found on disk: before
// bbolt searches one of idem's buckets for a key, the guard reads from the
// file the pages that search will read, as bbolt's cursor chooses them,
// and checks each (treePage.check, and idem's own rules for its buckets,
// for a page Open did not check: after a clean stop, or with CheckNever),
// and the walk itself (its depth, the order and ranges of keys). A
// damaged page is then ErrCorrupt, where bbolt would loop on a cycle,
// recurse until the stack overflows, follow a child id from past the
// page's end, or copy the gigabytes a damaged size claims. Sweeps and
// listings walk with the guard's cursor, never bbolt's.
//
// Each search reads its pages again (a few, one a level of the tree), to
// find the way bbolt will go; it checks a page only once in a session.
// A page once checked stays sound: bbolt writes a page id again only after
// freeing it, and what it writes is sound, made from pages that were
// checked; so is every page at or past the file's end at Open, or, when
// Open checked the whole file, every page.
type guard struct {
	r        io.ReaderAt // the file bbolt holds
	path     string      // its name, for errors
	pageSize uint64
	pages    sync.Pool // of *[]byte, pageSize long: the cursors' buffers
	// checked has a bit for each page below the file's end at Open, set
	// once the page is found sound.
	checked []atomic.Uint64
}

func newGuard(f *os.File, pageSize, pgid uint64) *guard {
	return &guard{r: f, path: f.Name(), pageSize: pageSize, checked: make([]atomic.Uint64, (pgid+63)/64)}
}

// corrupt is the error of damage found in bucket name.
func (g *guard) corrupt(name []byte, err error) error {
	return damaged{fmt.Errorf("%w: %s: bucket %s: %w", ErrCorrupt, g.path, name, err)}
}

// damaged is the guard's error: damage found before bbolt read it, maybe
// between two writes of one op, which the committer then rolls back whole
// (undoCorrupt).
type damaged struct{ err error }

func (d damaged) Error() string { return d.err.Error() }
func (d damaged) Unwrap() error { return d.err }

// sound reports whether page id was found sound, or written by bbolt.
func (g *guard) sound(id uint64) bool {
	return id/64 >= uint64(len(g.checked)) || g.checked[id/64].Load()&(1<<(id%64)) != 0
}

func (g *guard) setSound(id uint64) {
	if id/64 < uint64(len(g.checked)) {
		g.checked[id/64].Or(1 << (id % 64))
	}
}

// A bucket is one of idem's buckets in a transaction. Its methods call
// bbolt's once the guard, if any, has checked the pages they read; a nil
// guard means a new file, all of whose pages bbolt wrote.
type bucket struct {
	b    *bbolt.Bucket
	name []byte
	g    *guard
	pgid uint64 // the transaction's pages: its file's high-water mark
	// searched is the last key whose search the guard checked: a Put or
	// Delete after a Get of the same key reads the same pages.
	searched []byte
}

// bucket returns idem's top-level bucket name in tx. The root bucket,
// which finds it, is checked at every Open and later written by bbolt.
func (b *Backend) bucket(tx *bbolt.Tx, name []byte) *bucket {
	return guardedBucket(tx, name, b.guard)
}

func guardedBucket(tx *bbolt.Tx, name []byte, g *guard) *bucket {
	x := &bucket{b: tx.Bucket(name), name: name, g: g}
	if g != nil {
		x.pgid = uint64(tx.Size()) / g.pageSize
	}
	return x
}

// Get returns key's value, nil if it has none.
func (x *bucket) Get(key []byte) ([]byte, error) {
	if err := x.search(key, false); err != nil {
		return nil, err
	}
	return x.b.Get(key), nil
}

// Put sets key's value.
func (x *bucket) Put(key, value []byte) error {
	if err := x.search(key, false); err != nil {
		return err
	}
	return x.b.Put(key, value)
}

// Delete removes key. A delete can leave its page small enough that the
// commit merges it with a neighbour, which bbolt then reads: the guard
// checks the neighbours of each page on the way too.
func (x *bucket) Delete(key []byte) error {
	if err := x.search(key, true); err != nil {
		return err
	}
	return x.b.Delete(key)
}

// search checks the pages bbolt's search for key reads.
func (x *bucket) search(key []byte, neighbours bool) error {
	switch {
	case x.g == nil || x.b.RootPage() == 0: // a new file, or an inline bucket: part of the root bucket's page
		return nil
	case !neighbours && x.searched != nil && bytes.Equal(key, x.searched):
		return nil
	}
	c := x.cursor()
	defer c.release()
	if err := c.search(key, uint64(x.b.RootPage()), neighbours); err != nil {
		return x.g.corrupt(x.name, err)
	}
	x.searched = append(x.searched[:0], key...)
	return nil
}

// ascend calls fn with the bucket's keys and values in order, from the
// first key at or after from, until fn returns false. fn must not keep
// them. With a guard it walks the pages as the file holds them, checking
// each as it reaches it, and bbolt's cursor not at all: in a write
// transaction it does not see the transaction's own writes, which a walk
// that only looks for what to delete, as a sweep does, can miss (and see
// keys the transaction deleted, whose deletion is then a no-op).
func (x *bucket) ascend(from []byte, fn func(k, v []byte) bool) error {
	if x.g == nil {
		c := x.b.Cursor()
		var k, v []byte
		if from == nil {
			k, v = c.First()
		} else {
			k, v = c.Seek(from)
		}
		for ; k != nil && fn(k, v); k, v = c.Next() {
		}
		return nil
	}
	if x.b.RootPage() == 0 {
		// An inline bucket's page is inside the root bucket's, which
		// was checked, and a cursor over it reads nothing else.
		c := x.b.Cursor()
		for k, v := c.Seek(from); k != nil && fn(k, v); k, v = c.Next() {
		}
		return nil
	}
	c := x.cursor()
	defer c.release()
	if err := c.seek(from, uint64(x.b.RootPage())); err != nil {
		return x.g.corrupt(x.name, err)
	}
	var prev []byte
	for ; c.valid(); c.next() {
		k, v := c.current()
		if prev != nil && bytes.Compare(prev, k) >= 0 { // a page reached twice, or in the wrong place
			return x.g.corrupt(x.name, fmt.Errorf("key %q after %q, out of order", k, prev))
		}
		if !fn(k, v) {
			return nil
		}
		prev = append(prev[:0], k...)
	}
	if c.err != nil {
		return x.g.corrupt(x.name, c.err)
	}
	return nil
}

func (x *bucket) cursor() *cursor {
	return &cursor{g: x.g, pgid: x.pgid}
}

// A cursor walks a bucket's pages as bbolt's Cursor does (bbolt's
// cursor.go: search, goToFirstElementOnTheStack, next), reading each page
// from the file and checking it before it steps into it.
type cursor struct {
	g     *guard
	pgid  uint64
	stack []ref
	err   error     // the first damage met; the cursor is then invalid
	bufs  []*[]byte // taken from g.pages, for release
}

// release gives the cursor's page buffers back: its keys and values are
// then no longer valid.
func (c *cursor) release() {
	for _, b := range c.bufs {
		c.g.pages.Put(b)
	}
	c.bufs = nil
}

type ref struct {
	p      treePage
	index  int
	lo, hi []byte // the range of the page's keys, from its parents
}

// read reads and checks page id, a page of one of idem's buckets.
func (c *cursor) read(id uint64) (treePage, error) {
	buf, _ := c.g.pages.Get().(*[]byte)
	if buf == nil {
		b := make([]byte, c.g.pageSize)
		buf = &b
	}
	c.bufs = append(c.bufs, buf)
	p, _, err := readPage(c.g.r, c.g.pageSize, c.pgid, id, *buf)
	switch {
	case err != nil:
		return treePage{}, err
	case c.g.sound(id):
		return p, nil
	}
	if err := p.check(c.pgid, false); err != nil {
		return treePage{}, err
	}
	if p.branch() {
		c.g.setSound(id)
		return p, nil
	}
	for i := range p.count {
		v, isBucket := p.value(i)
		switch {
		case isBucket:
			return treePage{}, fmt.Errorf("page %d: %q is a bucket", id, p.key(i))
		case len(v) > MaxRecordSize: // a record's bound, and the others' values are empty
			return treePage{}, fmt.Errorf("page %d: record %q claims %d bytes, more than %d", id, p.key(i), len(v), MaxRecordSize)
		}
	}
	c.g.setSound(id)
	return p, nil
}

// push reads onto the stack the bucket's root page id, or, with a stack,
// the child of the branch on top, at its index.
func (c *cursor) push(id uint64) error {
	if len(c.stack) >= maxDepth {
		return fmt.Errorf("page %d: nested more than %d deep", id, maxDepth)
	}
	var lo, hi []byte
	if n := len(c.stack); n > 0 {
		top := c.stack[n-1]
		lo, hi = top.p.bounds(top.index, top.lo, top.hi)
	}
	p, err := c.read(id)
	if err != nil {
		return err
	}
	if err := p.within(lo, hi); err != nil {
		return err
	}
	c.stack = append(c.stack, ref{p: p, lo: lo, hi: hi})
	return nil
}

// search moves to key's place from the root page, as bbolt's search:
// in each branch, to the last element whose key is at most key (the
// first, if none is), and in the leaf, to the first element whose key is
// at least key. With neighbours, it also checks the pages beside each one
// it steps into, under the same parent.
func (c *cursor) search(key []byte, root uint64, neighbours bool) error {
	c.stack = c.stack[:0]
	if err := c.push(root); err != nil {
		return err
	}
	for {
		top := &c.stack[len(c.stack)-1]
		p := top.p
		if p.count == 0 && len(c.stack) > 1 {
			return errEmptyPage(p.id)
		}
		i := sort.Search(p.count, func(i int) bool { return bytes.Compare(p.key(i), key) >= 0 })
		if !p.branch() {
			top.index = i
			return nil
		}
		if i == p.count || !bytes.Equal(p.key(i), key) {
			i = max(i-1, 0)
		}
		top.index = i
		if neighbours {
			for _, j := range []int{i - 1, i + 1} {
				if j >= 0 && j < p.count {
					n, err := c.read(p.child(j))
					if err == nil {
						err = n.within(p.bounds(j, top.lo, top.hi))
					}
					if err != nil {
						return err
					}
				}
			}
		}
		if err := c.push(p.child(i)); err != nil {
			return err
		}
	}
}

// seek moves to the first key at or after from (nil: the first key), as
// bbolt's Seek and First do.
func (c *cursor) seek(from []byte, root uint64) error {
	if err := c.search(from, root, false); err != nil {
		return err
	}
	if top := c.stack[len(c.stack)-1]; top.index >= top.p.count {
		c.next()
	}
	return c.err
}

// valid reports whether the cursor is at a key.
func (c *cursor) valid() bool {
	if c.err != nil || len(c.stack) == 0 {
		return false
	}
	top := c.stack[len(c.stack)-1]
	return !top.p.branch() && top.index < top.p.count
}

func (c *cursor) current() (k, v []byte) {
	top := c.stack[len(c.stack)-1]
	v, _ = top.p.value(top.index)
	return top.p.key(top.index), v
}

// next moves to the next key: up the stack to the nearest page with an
// element left, then down its first elements to a leaf. A leaf with no
// elements below the root is damage (errEmptyPage); refusing it bounds
// the walk's reads by the keys it yields.
func (c *cursor) next() {
	i := len(c.stack) - 1
	for ; i >= 0; i-- {
		if r := &c.stack[i]; r.index < r.p.count-1 {
			r.index++
			break
		}
	}
	if i < 0 {
		c.stack = c.stack[:0] // the end
		return
	}
	c.stack = c.stack[:i+1]
	for {
		top := c.stack[len(c.stack)-1]
		if !top.p.branch() {
			break
		}
		if c.err = c.push(top.p.child(top.index)); c.err != nil {
			return
		}
	}
	if top := c.stack[len(c.stack)-1]; top.p.count == 0 {
		c.err = errEmptyPage(top.p.id)
	}
}
