package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A resolution is the outcome an operator gives an interrupted key.
type resolution struct {
	result []byte        // the result, in the store's JSON encoding; nil with errMsg
	errMsg string        // a final error's message
	ttl    time.Duration // how long the outcome is replayed
}

// parseResolution reads resolve's flags: exactly one of -result and -error.
func parseResolution(args []string) (*resolution, error) {
	flags := flag.NewFlagSet("resolve", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	result := flags.String("result", "", "the operation's result, as JSON (the store's default Codec)")
	errMsg := flags.String("error", "", "the operation's final error message")
	ttl := flags.Duration("ttl", 24*time.Hour, "how long the outcome is replayed")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case flags.NArg() > 0:
		return nil, fmt.Errorf("unexpected %q", flags.Arg(0))
	case (*result == "") == (*errMsg == ""):
		return nil, errors.New("give the outcome: either -result JSON or -error MSG")
	case *ttl <= 0:
		return nil, errors.New("-ttl must be positive")
	case *result != "" && !json.Valid([]byte(*result)):
		return nil, fmt.Errorf("-result is not valid JSON: %s", *result)
	}
	r := &resolution{errMsg: *errMsg, ttl: *ttl}
	if *result != "" {
		r.result = []byte(*result)
	}
	return r, nil
}

// resolve settles key, which must be interrupted, with the outcome r: the
// operator has checked that its operation took effect. Like
// idem.Store.Resolve, it is fenced by the interrupted claim's token.
func resolve(ctx context.Context, b target, key string, r *resolution, w io.Writer, now time.Time) error {
	rec, ok, err := b.Get(ctx, key, now)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("no record for key %q", key)
	case rec.State == backend.StateCompleted:
		return fmt.Errorf("key %q already has an outcome; nothing to resolve", key)
	case rec.State == backend.StatePending && !rec.Lapsed(now):
		return fmt.Errorf("key %q is in flight: its owner's lease holds", key)
	}
	done := rec
	done.State, done.Value, done.Failed, done.ErrMsg = backend.StateCompleted, r.result, r.errMsg != "", r.errMsg
	if done.Value == nil {
		done.Value = []byte("null")
	}
	if err := b.Complete(ctx, done, now, r.ttl); err != nil {
		if errors.Is(err, backend.ErrNotOwner) {
			return fmt.Errorf("key %q changed hands while it was resolved; look again with: idem show", key)
		}
		return err
	}
	fmt.Fprintf(w, "resolved %q: later calls with this key replay this outcome for %s\n", key, r.ttl)
	return nil
}
