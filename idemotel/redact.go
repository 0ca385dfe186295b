package idemotel

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// failSpan marks sp failed with err, as RecordError and SetStatus would,
// but with the key in err's message replaced by "idem.key.hash:" and its
// hash unless Options.RawKeys: a Backend's error names the key it failed
// on (bolt's `key "..." is ...`), and the status and the exception event
// are telemetry like any attribute.
func (o *observer) failSpan(sp trace.Span, key, hash string, err error) {
	msg := err.Error()
	if !o.opts.RawKeys {
		msg = hideKey(msg, key, hash)
	}
	sp.AddEvent("exception", trace.WithAttributes(
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", msg),
	))
	sp.SetStatus(codes.Error, msg)
}

// hideKey returns msg with key replaced by "idem.key.hash:" and hash in
// each form an error may hold it: as it is, and quoted by %q once or more
// (an error quoted into another's message). The forms are replaced in one
// pass, the longest first, so that no replacement is replaced again (a
// short key's bytes may occur in the hash).
func hideKey(msg, key, hash string) string {
	forms := []string{key}
	q := key
	for range 3 {
		q = strconv.Quote(q)
		if f := q[1 : len(q)-1]; f != forms[len(forms)-1] {
			forms = append(forms, f)
		}
	}
	slices.Reverse(forms) // each quoting is longer than the form it quotes
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, "idem.key.hash:"+hash)
	}
	return strings.NewReplacer(pairs...).Replace(msg)
}
