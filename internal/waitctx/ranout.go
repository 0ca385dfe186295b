package waitctx

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed094d4201/idem/backend"
)

// RanOut returns err, the answer of a call made under bound (a wait
// bound: a Ctx, or a transaction's), as a wait that ran out when bound's
// own end cut the call short before it claimed anything (the bound ran
// out, or the caller hung up): err then matches ErrInProgress too, and an
// adapter answers it as any wait that ran out (retry later), never as the
// store's failure. A client can cause it at will, so it is no error to
// log. Any other err is returned as it is.
func RanOut(bound context.Context, err error) error {
	if err == nil || errors.Is(err, backend.ErrInProgress) {
		return err
	}
	if cerr := bound.Err(); cerr != nil && errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", backend.ErrInProgress, err)
	}
	return err
}
