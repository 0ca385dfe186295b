package idemhttp

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"
	"unicode"
	"unicode/utf8"
)

// The canonical form that JSONFingerprint hashes. C(v), for a value v:
//
//	null, true, false   'n', 't', 'f'
//	number              'd' uvarint(len) the number as written
//	string              's' uvarint(len) the decoded string
//	array               '[' C(e1) C(e2) ... ']'
//	object              '{' uvarint(n) M1 ... Mn, its members sorted by
//	                    decoded key (no two equal under case folding)
//	member              M = uvarint(len) key V, where V is C(value) when
//	                    that is at most spillAt bytes, else '#' SHA-256(C(value))
//
// Every C is self-delimiting and the tags differ, so distinct values have
// distinct forms. Sorting needs all of an object's members at once, so
// the open objects' members are kept, each at most spillAt bytes plus its
// key; the rest, anything outside every object, streams into the hash.
// That keeps the memory a body costs to the size of its widest object, and
// typically to a few kilobytes, whatever its length.
const (
	maxJSONDepth = 10000 // open arrays and objects, as encoding/json allows
	spillAt      = 512   // bytes of a member's value kept before hashing it
)

// canon scans one JSON text and digests its canonical form, iteratively:
// the stack of open containers is data, not recursion.
type canon struct {
	in      []byte
	pos     int
	arena   []byte   // open objects' members; the innermost sink's bytes last
	members []member // open objects' members, in the order they came
	objs    []object // open objects, innermost last
	kinds   []byte   // open containers, '[' or '{', innermost last
	root    sink     // the value outside every object
	str     []byte   // a string with escapes or invalid UTF-8, decoded
	sorted  []byte   // a short object's members in key order
	folds   []folded // an object's folded keys, while ambiguous looks for pairs
	hdr     [1 + binary.MaxVarintLen64]byte
}

// sink is where a value's canonical bytes go: the arena from start on, then
// h once they pass spillAt.
type sink struct {
	start   int
	h       hash.Hash // kept for reuse by the next member at this depth
	spilled bool
}

type object struct {
	start, members int  // where its members begin in arena and members
	val            sink // the value of its member being read
}

// member is M, arena[start:end].
type member struct{ start, end int }

// canonicalJSON validates in as exactly one JSON value and returns the
// SHA-256 of its canonical form.
func canonicalJSON(in []byte) ([sha256.Size]byte, error) {
	c := &canon{in: in}
	c.root = sink{h: sha256.New(), spilled: true}
	var d [sha256.Size]byte
	if err := c.parse(); err != nil {
		return d, err
	}
	c.root.h.Write(c.arena)
	c.root.h.Sum(d[:0])
	return d, nil
}

// parse reads values until the outermost one ends; after each, it closes
// the containers that end there or moves on to the next element or member.
func (c *canon) parse() error {
	for {
		if err := c.value(); err != nil {
			return err
		}
	after:
		for {
			c.skipSpace()
			if len(c.kinds) == 0 {
				return c.end()
			}
			if c.pos == len(c.in) {
				return c.fail("unexpected end of input")
			}
			b := c.in[c.pos]
			if c.kinds[len(c.kinds)-1] == '[' {
				switch b {
				case ',':
					c.pos++
					break after
				case ']':
					c.pos++
					c.kinds = c.kinds[:len(c.kinds)-1]
					c.tag(']')
				default:
					return c.failHere("after array element")
				}
				continue
			}
			c.endMember()
			switch b {
			case ',':
				c.pos++
				if err := c.key(); err != nil {
					return err
				}
				break after
			case '}':
				c.pos++
				if err := c.closeObject(); err != nil {
					return err
				}
			default:
				return c.failHere("after object member")
			}
		}
	}
}

// value reads one scalar, or opens a container and reads up to its first
// element or member value (closing it at once if it is empty).
func (c *canon) value() error {
	for {
		c.skipSpace()
		if c.pos == len(c.in) {
			return c.fail("unexpected end of input")
		}
		switch b := c.in[c.pos]; b {
		case '[', '{':
			if len(c.kinds) == maxJSONDepth {
				return fmt.Errorf("request body nests JSON deeper than %d arrays and objects (at byte %d)", maxJSONDepth, c.pos)
			}
			c.pos++
			c.kinds = append(c.kinds, b)
			if b == '[' {
				c.tag('[')
			} else {
				c.openObject()
			}
			c.skipSpace()
			if c.pos < len(c.in) && c.in[c.pos] == b+2 { // ']' or '}'
				c.pos++
				if b == '{' {
					return c.closeObject()
				}
				c.kinds = c.kinds[:len(c.kinds)-1]
				c.tag(']')
				return nil
			}
			if b == '{' {
				if err := c.key(); err != nil {
					return err
				}
			}
		case '"':
			s, err := c.string()
			if err != nil {
				return err
			}
			c.put('s', s)
			return nil
		case 't':
			return c.literal("true")
		case 'f':
			return c.literal("false")
		case 'n':
			return c.literal("null")
		default:
			return c.number()
		}
	}
}

// sink is where the value being read goes.
func (c *canon) sink() *sink {
	if len(c.objs) == 0 {
		return &c.root
	}
	return &c.objs[len(c.objs)-1].val
}

// write appends p to the current sink, spilling it into its hash once it
// holds more than spillAt bytes.
func (c *canon) write(p []byte) {
	s := c.sink()
	if len(c.arena)-s.start+len(p) > spillAt {
		c.spill(s, len(c.arena))
		c.arena = c.arena[:s.start]
		if len(p) > spillAt {
			s.h.Write(p)
			return
		}
	}
	c.grow(len(p))
	c.arena = append(c.arena, p...)
}

// spill writes the bytes of s, up to end in the arena, to its hash.
func (c *canon) spill(s *sink, end int) {
	if s.h == nil {
		s.h = sha256.New()
	}
	if !s.spilled {
		s.h.Reset()
		s.spilled = true
	}
	s.h.Write(c.arena[s.start:end])
}

// grow makes room for n more bytes in the arena by doubling it at least,
// so that it allocates at most twice its largest size in all.
func (c *canon) grow(n int) {
	if cap(c.arena)-len(c.arena) < n {
		c.arena = slices.Grow(c.arena, max(n, cap(c.arena)))
	}
}

// tag writes the one byte b.
func (c *canon) tag(b byte) {
	c.hdr[0] = b
	c.write(c.hdr[:1])
}

// put writes tag, the length of p, and p.
func (c *canon) put(tag byte, p []byte) {
	c.hdr[0] = tag
	n := binary.PutUvarint(c.hdr[1:], uint64(len(p)))
	c.write(c.hdr[:1+n])
	c.write(p)
}

func (c *canon) openObject() {
	if n := len(c.objs); n < cap(c.objs) {
		c.objs = c.objs[:n+1] // keeps the spill hash of that depth
	} else {
		c.objs = append(c.objs, object{})
	}
	o := &c.objs[len(c.objs)-1]
	o.start, o.members = len(c.arena), len(c.members)
	o.val.spilled = false
}

// endMember closes the value of the innermost object's last member,
// replacing it by its digest if it spilled.
func (c *canon) endMember() {
	s := &c.objs[len(c.objs)-1].val
	if s.spilled {
		c.spill(s, len(c.arena))
		c.arena = c.arena[:s.start]
		c.grow(1 + sha256.Size)
		c.arena = append(c.arena, '#')
		c.arena = s.h.Sum(c.arena)
		s.spilled = false
	}
	c.members[len(c.members)-1].end = len(c.arena)
}

// keyOf is the key of m.
func (c *canon) keyOf(m member) []byte {
	if n := int(c.arena[m.start]); n < 0x80 { // one byte long: most keys
		return c.arena[m.start+1 : m.start+1+n]
	}
	n, w := binary.Uvarint(c.arena[m.start:])
	return c.arena[m.start+w : m.start+w+int(n)]
}

// closeObject writes the innermost object to the enclosing sink, its
// members in key order, or refuses it if two of its keys are equal under
// case folding (see ambiguous). Its members lie in the arena past that sink's own bytes, so
// they are either hashed from there, if the sink spills, or put in order
// aside first, which they then fit in spillAt bytes.
func (c *canon) closeObject() error {
	o := c.objs[len(c.objs)-1]
	c.objs = c.objs[:len(c.objs)-1]
	c.kinds = c.kinds[:len(c.kinds)-1]
	ms := c.members[o.members:]
	if err := c.ambiguous(ms); err != nil {
		return err
	}
	slices.SortFunc(ms, func(a, b member) int {
		return bytes.Compare(c.keyOf(a), c.keyOf(b))
	})
	kept := ms
	c.hdr[0] = '{'
	hdr := c.hdr[:1+binary.PutUvarint(c.hdr[1:], uint64(len(kept)))]
	size := len(hdr)
	for _, m := range kept {
		size += m.end - m.start
	}
	s := c.sink()
	if o.start-s.start+size > spillAt {
		c.spill(s, o.start)
		s.h.Write(hdr)
		for _, m := range kept {
			s.h.Write(c.arena[m.start:m.end])
		}
		c.arena = c.arena[:s.start]
	} else {
		c.sorted = append(c.sorted[:0], hdr...)
		for _, m := range kept {
			c.sorted = append(c.sorted, c.arena[m.start:m.end]...)
		}
		c.arena = c.arena[:o.start]
		c.grow(size)
		c.arena = append(c.arena, c.sorted...)
	}
	c.members = c.members[:o.members]
	return nil
}

// ambiguous refuses an object two of whose keys are equal under Unicode
// case folding, the same key repeated included. A handler decoding into a
// struct reads such an object otherwise than into any: encoding/json
// matches struct fields without regard to case, the last matching member
// winning, and decodes a repeated object-valued key into one struct,
// merging them, so no canonical form can say what it meant; the
// middleware answers 400. The members' folded keys are hashed and sorted,
// to find the pairs in n log n with no allocation once c.folds has grown.
func (c *canon) ambiguous(ms []member) error {
	if len(ms) < 2 {
		return nil
	}
	c.folds = slices.Grow(c.folds[:0], len(ms))
	for i, m := range ms {
		c.folds = append(c.folds, folded{foldHash(c.keyOf(m)), i})
	}
	slices.SortFunc(c.folds, func(a, b folded) int { return cmp.Compare(a.h, b.h) })
	for i := 1; i < len(c.folds); i++ {
		a, b := c.folds[i-1], c.folds[i]
		if a.h == b.h && bytes.EqualFold(c.keyOf(ms[a.i]), c.keyOf(ms[b.i])) {
			return fmt.Errorf("request body's JSON object has the keys %q and %q, which a struct cannot tell apart (at byte %d)",
				c.keyOf(ms[a.i]), c.keyOf(ms[b.i]), c.pos)
		}
	}
	return nil
}

// folded is a member's index and the hash of its case-folded key.
type folded struct {
	h uint64
	i int
}

// foldHash is the FNV-1a hash of key with each rune replaced by the least
// rune of its case-folding orbit, so that keys bytes.EqualFold calls equal
// hash alike.
func foldHash(key []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, r := range string(key) {
		switch {
		case r < utf8.RuneSelf:
			if 'a' <= r && r <= 'z' { // the least of an ASCII letter's orbit: upper case
				r -= 'a' - 'A'
			}
		default:
			least := r
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				least = min(least, f)
			}
			r = least
		}
		h = (h ^ uint64(r)) * 1099511628211
	}
	return h
}
