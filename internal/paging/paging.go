// Package paging drives a backend.Lister's Each as a walk in key order,
// one bounded page at a time, so that no read stays open while fn runs.
package paging

import (
	"context"

	"github.com/seed094d4201/idem/backend"
)

// Size is how many records a page holds: enough that a listing of
// millions costs few reads, few enough that a page's memory is small.
const Size = 500

// Each calls read for successive pages of records in key order, each
// starting after the last key of the one before ("" for the first), and
// calls fn with each page's records once read has returned. A page shorter
// than Size ends the walk. It stops at the first error of read, fn or ctx
// (refused, backend.Refuse, if ctx ended before a page was read).
//
// read must return at most limit records, in key order, with keys greater
// than after; it is the backend's short read (one query, one read
// transaction), and has ended by the time fn is called.
func Each(ctx context.Context, read func(ctx context.Context, after string, limit int) ([]backend.Record, error), fn func(backend.Record) error) error {
	after := ""
	for {
		if err := ctx.Err(); err != nil {
			// Before a page's read: nothing was read, as a Backend's
			// refusal of an ended ctx says (backend.ErrRefused).
			return backend.Refuse(err)
		}
		page, err := read(ctx, after, Size)
		if err != nil {
			return err
		}
		for _, rec := range page {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		if len(page) < Size {
			return nil
		}
		after = page[len(page)-1].Key
	}
}
