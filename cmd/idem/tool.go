package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/idemhttp"
)

// A tool runs the commands on one opened target.
type tool struct {
	b     target
	where string // as given, for messages that name the next command
	name  string // -name, if given
	w     io.Writer
	// now is the instant the records are judged at: the server's for a
	// shared backend, else this host's; clock names it, for messages.
	now   time.Time
	clock string
	json  bool
	// scoped: KEY was given with -scope, as idemhttp and idemgrpc store it.
	scoped bool
}

// next returns the command line of another command on the same target.
func (t *tool) next(cmd, key string, more ...string) string {
	parts := []string{"idem", cmd, shellQuote(display(t.where))}
	if t.name != "" {
		parts = append(parts, "-name", shellQuote(t.name))
	}
	parts = append(parts, more...)
	switch {
	case strings.HasPrefix(key, "-"): // after "--", so it is not taken for a flag
		parts = append(parts, "--", shellQuote(key))
	case key != "":
		parts = append(parts, shellQuote(key))
	}
	return strings.Join(parts, " ")
}

// view is a record as the commands print it.
type view struct {
	Key         string     `json:"key"`
	State       string     `json:"state"`
	Claimed     *time.Time `json:"claimed,omitempty"`
	Expires     *time.Time `json:"expires,omitempty"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	Fingerprint string     `json:"fingerprint"`
	Token       string     `json:"token"`
	FinalError  *string    `json:"final_error,omitempty"`
	Value       *string    `json:"value,omitempty"`     // UTF-8
	ValueHex    *string    `json:"value_hex,omitempty"` // otherwise
	ValueBytes  int        `json:"value_bytes"`
	RecordBytes int        `json:"record_bytes"`
	Steps       []stepView `json:"steps,omitempty"`
}

// stepView is a recorded step as the commands print it.
type stepView struct {
	Name       string    `json:"name"`
	At         time.Time `json:"at"`
	FinalError *string   `json:"final_error,omitempty"`
	Value      *string   `json:"value,omitempty"`     // UTF-8
	ValueHex   *string   `json:"value_hex,omitempty"` // otherwise
}

func (t *tool) view(rec backend.Record) view {
	v := view{Key: rec.Key, State: state(rec, t.now), Fingerprint: fmt.Sprintf("%x", rec.Fingerprint), Token: rec.Token, ValueBytes: len(rec.Value)}
	at := func(x time.Time) *time.Time {
		if x.IsZero() {
			return nil
		}
		x = x.UTC()
		return &x
	}
	v.Claimed, v.Expires, v.LeaseUntil = at(rec.CreatedAt), at(rec.ExpiresAt), at(rec.LeaseUntil)
	if rec.Failed {
		v.FinalError = &rec.ErrMsg
	}
	v.Value, v.ValueHex = printable(rec.Value)
	for _, st := range rec.Steps {
		sv := stepView{Name: st.Name, At: st.At.UTC()}
		if st.Failed {
			sv.FinalError = &st.ErrMsg
		}
		sv.Value, sv.ValueHex = printable(st.Value)
		v.Steps = append(v.Steps, sv)
	}
	if enc, err := rec.MarshalBinary(); err == nil {
		v.RecordBytes = len(enc)
	}
	return v
}

// printable returns b as text if it is UTF-8, else as hex.
func printable(b []byte) (text, hex *string) {
	s := string(b)
	if utf8.Valid(b) {
		return &s, nil
	}
	s = fmt.Sprintf("%x", b)
	return nil, &s
}

// stateOrder puts interrupted keys first: they wait for an operator.
func stateOrder(s string) int {
	switch {
	case strings.HasPrefix(s, "interrupted"):
		return 0
	case s == "pending":
		return 1
	}
	return 2
}

func (t *tool) inspect(ctx context.Context, only string) error {
	var recs []backend.Record
	err := t.b.Each(ctx, func(rec backend.Record) error {
		if only == "" || strings.HasPrefix(state(rec, t.now), only) {
			recs = append(recs, rec)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.SliceStable(recs, func(i, j int) bool {
		return stateOrder(state(recs[i], t.now)) < stateOrder(state(recs[j], t.now))
	})
	if t.json {
		views := make([]view, 0, len(recs))
		for _, rec := range recs {
			views = append(views, t.view(rec))
		}
		return json.NewEncoder(t.w).Encode(views)
	}
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tAGE\tEXPIRES IN\tVALUE BYTES\tRECORD BYTES")
	for _, rec := range recs {
		v := t.view(rec)
		fmt.Fprintf(tw, "%q\t%s\t%s\t%s\t%d\t%d\n", rec.Key, v.State, age(rec, t.now), expiresIn(rec, t.now), v.ValueBytes, v.RecordBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(t.w, "%d record(s)\n", len(recs))
	return nil
}

func (t *tool) get(ctx context.Context, key string) (backend.Record, error) {
	rec, ok, err := t.b.Get(ctx, key, t.now)
	switch {
	case err != nil:
		return rec, err
	case !ok:
		return rec, fmt.Errorf("%w: %q in %s (%s)", errNoKey, key, display(t.where), t.hint(ctx, key))
	}
	return rec, nil
}

// hint says where to look for a key that has no record: an Idempotency-Key
// that idemhttp or idemgrpc stored is found only with -scope.
func (t *tool) hint(ctx context.Context, key string) string {
	list := "list the keys with: " + t.next("inspect", "")
	if t.scoped {
		return list
	}
	if _, ok, err := t.b.Get(ctx, idemhttp.StoreKey("", key), t.now); err == nil && ok {
		return fmt.Sprintf("an idemhttp or idemgrpc route without a Scope stored it: %s", t.next("show", key, "-scope ''"))
	}
	return "an Idempotency-Key that an idemhttp or idemgrpc route stored is found with -scope and the client's scope (-scope '' for a route without a Scope); or " + list
}

func (t *tool) show(ctx context.Context, key string) error {
	rec, err := t.get(ctx, key)
	if err != nil {
		return err
	}
	v := t.view(rec)
	if t.json {
		return json.NewEncoder(t.w).Encode(v)
	}
	fmt.Fprintf(t.w, "key:         %q\n", rec.Key)
	fmt.Fprintf(t.w, "state:       %s\n", v.State)
	fmt.Fprintf(t.w, "claimed:     %s (%s ago)\n", rec.CreatedAt.UTC().Format(time.RFC3339Nano), age(rec, t.now))
	fmt.Fprintf(t.w, "expires:     %s\n", expiresIn(rec, t.now))
	if rec.State == backend.StatePending && !rec.LeaseUntil.IsZero() {
		fmt.Fprintf(t.w, "lease until: %s\n", rec.LeaseUntil.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintf(t.w, "fingerprint: %s\n", v.Fingerprint)
	fmt.Fprintf(t.w, "token:       %s\n", rec.Token)
	if rec.Failed {
		fmt.Fprintf(t.w, "final error: %q\n", rec.ErrMsg)
	}
	writeValue(t.w, "value", rec.Value)
	for i, st := range v.Steps {
		if i == 0 {
			fmt.Fprintln(t.w, "steps:")
		}
		outcome := inline(rec.Steps[i].Value)
		if st.FinalError != nil {
			outcome = fmt.Sprintf("final error %q", *st.FinalError)
		}
		fmt.Fprintf(t.w, "  %d. %q at %s: %s\n", i+1, st.Name, st.At.Format(time.RFC3339Nano), outcome)
	}
	if rec.State == backend.StateInterrupted || rec.Lapsed(t.now) {
		fmt.Fprintln(t.w, "\nThe operation may or may not have taken effect. Check its real outcome, then")
		fmt.Fprintf(t.w, "if it did not happen:  %s\n", t.next("forget", key))
		fmt.Fprintf(t.w, "if it did:             %s\n", t.next("resolve", key, "-result JSON"))
	}
	return nil
}

func (t *tool) forget(ctx context.Context, key string) error {
	rec, err := t.get(ctx, key)
	if err != nil {
		return err
	}
	if err := t.b.Forget(ctx, key, t.now); err != nil {
		if errors.Is(err, backend.ErrInProgress) {
			return t.inFlight(ctx, rec)
		}
		return err
	}
	fmt.Fprintf(t.w, "forgot %q: the next call with this key runs its operation again\n", key)
	return nil
}

// inFlight explains a refusal for a key whose lease holds, and until when.
func (t *tool) inFlight(ctx context.Context, rec backend.Record) error {
	if fresh, ok, err := t.b.Get(ctx, rec.Key, t.now); err == nil && ok {
		rec = fresh
	}
	if rec.LeaseUntil.IsZero() {
		return fmt.Errorf("key %q is in flight: its owner has not recorded an outcome yet", rec.Key)
	}
	return fmt.Errorf("key %q is in flight: its owner's lease holds until %s (in %s by %s); if the owner is gone, try again after that",
		rec.Key, rec.LeaseUntil.UTC().Format(time.RFC3339), rec.LeaseUntil.Sub(t.now).Round(time.Second), t.clock)
}

// check reads every record, which decodes each; a bolt file's structure
// was checked as it opened.
func (t *tool) check(ctx context.Context) error {
	n := 0
	var last string
	err := t.b.Each(ctx, func(rec backend.Record) error {
		n++
		last = rec.Key
		return nil
	})
	if err != nil {
		if n > 0 {
			return fmt.Errorf("after %d good record(s), the last %q: %w", n, last, err)
		}
		return err
	}
	fmt.Fprintf(t.w, "no damage found in %s: %d record(s)\n", display(t.where), n)
	return nil
}

func (t *tool) sweep(ctx context.Context) error {
	total := 0
	for {
		n, err := t.b.Sweep(ctx, t.now, 1000)
		total += n
		if err != nil {
			return fmt.Errorf("after %d committed deletion(s): %w", total, err)
		}
		if n < 1000 {
			fmt.Fprintf(t.w, "swept %d expired record(s)\n", total)
			return nil
		}
	}
}

func state(rec backend.Record, now time.Time) string {
	switch {
	case rec.State == backend.StateCompleted && rec.Failed:
		return "completed (final error)"
	case rec.Lapsed(now):
		return "interrupted (lease lapsed)"
	}
	return rec.State.String()
}

func age(rec backend.Record, now time.Time) string {
	if rec.CreatedAt.IsZero() {
		return "unknown"
	}
	return now.Sub(rec.CreatedAt).Round(time.Second).String()
}

func expiresIn(rec backend.Record, now time.Time) string {
	switch {
	case rec.State != backend.StateCompleted:
		return "never (waits for an operator)"
	case !now.Before(rec.ExpiresAt):
		return "expired"
	}
	return rec.ExpiresAt.Sub(now).Round(time.Second).String()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r == '@' || r == '+' || r == '=' ||
			r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
