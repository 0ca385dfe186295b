// Command idem inspects and repairs the records of an idem store: a bolt
// file, a PostgreSQL table or a Redis key prefix.
//
//	idem [-name NAME] inspect WHERE      list every key: state, age, expiry, sizes
//	idem [-name NAME] show WHERE KEY     one key's record in full
//	idem [-name NAME] forget WHERE KEY   drop a key's record: an operator's
//	                                     reconciliation of an interrupted key whose
//	                                     operation did not take effect
//	idem [-name NAME] resolve WHERE KEY (-result JSON | -error MSG) [-ttl D]
//	                                     settle an interrupted key whose operation did
//	                                     take effect: later calls replay this outcome
//	idem [-name NAME] sweep WHERE        delete the expired records
//
// WHERE is a bolt file, a postgres:// DSN or a redis:// URL; -name is the
// PostgreSQL table or the Redis key prefix, if not the default. A bolt file
// must not be open in a running service: bbolt allows one process at a
// time, and idem fails after a second rather than wait.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/seed094d4201/idem/backend"
)

const usage = `usage:
  idem [-name NAME] inspect WHERE      list every key: state, age, expiry, sizes
  idem [-name NAME] show WHERE KEY     one key's record in full
  idem [-name NAME] forget WHERE KEY   drop a key's record (an interrupted key that did not happen)
  idem [-name NAME] resolve WHERE KEY (-result JSON | -error MSG) [-ttl 24h]
                                       settle an interrupted key that did happen: replay this outcome
  idem [-name NAME] sweep WHERE        delete the expired records
WHERE is a bolt file, a postgres:// DSN or a redis:// URL; NAME the table or key prefix.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, time.Now()))
}

// run carries out one command and returns the process's exit code: 0 done,
// 1 failed, 2 misused.
func run(args []string, stdout, stderr io.Writer, now time.Time) int {
	flags := flag.NewFlagSet("idem", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	name := flags.String("name", "", "PostgreSQL table or Redis key prefix")
	if err := flags.Parse(args); err != nil {
		fmt.Fprint(stderr, usage)
		return 2
	}
	args = flags.Args()
	want := map[string]int{"inspect": 2, "show": 3, "forget": 3, "sweep": 2, "resolve": 3}
	if len(args) == 0 || want[args[0]] == 0 || len(args) < want[args[0]] || (args[0] != "resolve" && want[args[0]] != len(args)) {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, where := args[0], args[1]
	var outcome *resolution
	if cmd == "resolve" {
		var err error
		if outcome, err = parseResolution(args[3:]); err != nil {
			fmt.Fprintf(stderr, "idem resolve: %v\n%s", err, usage)
			return 2
		}
	}
	if err := command(cmd, where, *name, args[2:], outcome, stdout, now); err != nil {
		fmt.Fprintf(stderr, "idem %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

func command(cmd, where, name string, rest []string, outcome *resolution, w io.Writer, now time.Time) error {
	ctx := context.Background()
	b, closeTarget, err := openTarget(ctx, where, name, w)
	if err != nil {
		return err
	}
	defer closeTarget()
	switch cmd {
	case "inspect":
		return inspect(ctx, b, w, now)
	case "show":
		return show(ctx, b, rest[0], w, now)
	case "resolve":
		return resolve(ctx, b, rest[0], outcome, w, now)
	case "forget":
		if err := b.Forget(ctx, rest[0], now); err != nil {
			return err
		}
		fmt.Fprintf(w, "forgot %q: the next call with this key runs its operation again\n", rest[0])
		return nil
	default: // sweep
		total := 0
		for {
			n, err := b.Sweep(ctx, now, 1000)
			total += n
			if err != nil {
				return err
			}
			if n < 1000 {
				fmt.Fprintf(w, "swept %d expired record(s)\n", total)
				return nil
			}
		}
	}
}

func inspect(ctx context.Context, b target, w io.Writer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tAGE\tEXPIRES IN\tVALUE BYTES\tRECORD BYTES")
	count := 0
	err := b.Each(ctx, func(rec backend.Record) error {
		count++
		size := 0
		if enc, err := rec.MarshalBinary(); err == nil {
			size = len(enc)
		}
		fmt.Fprintf(tw, "%q\t%s\t%s\t%s\t%d\t%d\n", rec.Key, state(rec, now), age(rec, now), expiresIn(rec, now), len(rec.Value), size)
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d record(s)\n", count)
	return nil
}

func show(ctx context.Context, b target, key string, w io.Writer, now time.Time) error {
	rec, ok, err := b.Get(ctx, key, now)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no record for key %q", key)
	}
	fmt.Fprintf(w, "key:         %q\n", rec.Key)
	fmt.Fprintf(w, "state:       %s\n", state(rec, now))
	fmt.Fprintf(w, "claimed:     %s (%s ago)\n", rec.CreatedAt.UTC().Format(time.RFC3339Nano), age(rec, now))
	fmt.Fprintf(w, "expires:     %s\n", expiresIn(rec, now))
	fmt.Fprintf(w, "fingerprint: %x\n", rec.Fingerprint)
	fmt.Fprintf(w, "token:       %s\n", rec.Token)
	if rec.Failed {
		fmt.Fprintf(w, "final error: %q\n", rec.ErrMsg)
	}
	if utf8.Valid(rec.Value) {
		fmt.Fprintf(w, "value:       %q\n", rec.Value)
	} else {
		fmt.Fprintf(w, "value (hex): %x\n", rec.Value)
	}
	if rec.State == backend.StateInterrupted || rec.Lapsed(now) {
		fmt.Fprintln(w, "\nThe operation may or may not have taken effect. Check its real outcome,")
		fmt.Fprintf(w, "then, if it did not happen, clear the key with: idem forget FILE %q\n", rec.Key)
		fmt.Fprintf(w, "or, if it did, settle it with:                idem resolve FILE %q -result JSON\n", rec.Key)
	}
	return nil
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
