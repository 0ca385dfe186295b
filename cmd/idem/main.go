// Command idem inspects and repairs the records of an idem store: a bolt
// file, a PostgreSQL table or a Redis key prefix.
//
//	idem inspect WHERE [-state S] [-json]
//	idem show    WHERE KEY [-scope S] [-json]
//	idem forget  WHERE KEY [-scope S]
//	idem resolve WHERE KEY (-result JSON | -error MSG) [-ttl D] [-scope S]
//	idem sweep   WHERE
//
// Run idem help for the whole text, flags and exit codes included. A bolt
// file must not be open in a running service: bbolt allows one writer at a
// time, and idem fails after a second rather than wait.
//
// On a shared backend (PostgreSQL, MySQL, Redis) the commands judge leases,
// ages and expiries by the server's clock, read as they start, as the
// backend does: the operator's host may run ahead or behind. A file's
// records are judged by this host's clock.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

const usage = `idem inspects and repairs the records of an idem store.

usage:
  idem inspect WHERE [-state S] [-json]     list the keys, interrupted first:
                                            state, age, expiry, sizes
  idem show WHERE KEY [-scope S] [-json]    one key's record in full
  idem forget WHERE KEY [-scope S]          drop an interrupted key whose operation
                                            did not happen: the next call runs it
  idem resolve WHERE KEY (-result JSON | -error MSG) [-ttl 24h] [-scope S] [-force]
                                            settle an interrupted key whose operation
                                            did happen: later calls replay this outcome
                                            (-force: even if -result is not shaped like
                                            the store's other results)
  idem sweep WHERE                          delete the expired records
  idem check WHERE                          look for damage: a bolt file's structure,
                                            and every record
  idem help                                 this text

WHERE is a bolt file, sqlite:FILE, a postgres:// DSN, a mysql://user@host/db URL
or a redis:// URL. Flags may come
before or after the command and its arguments; after -- every argument is
taken as it is (for a key that starts with "-"):
  -name NAME    the PostgreSQL, MySQL or SQLite table or Redis key prefix, if not
                the default (idem_keys; no prefix)
  -scope S      KEY is an Idempotency-Key that idemhttp or idemgrpc stored for
                the client scope S (its store key is idemhttp.StoreKey(S, KEY));
                -scope '' for a route without a Scope
  -state S      inspect only the keys in state S: pending, interrupted, completed
  -json         inspect and show print JSON
  -timeout D    bound on the whole command, network calls included (default 30s)
inspect, show and check never write: a bolt or SQLite file is opened read-only.

exit status: 0 done, 1 failed, 2 misused, 3 no such key
`

// Exit codes, as the usage text documents them.
const (
	exitOK     = 0
	exitFailed = 1
	exitMisuse = 2
	exitNoKey  = 3
)

// errNoKey is returned by the commands on a key that has no record.
var errNoKey = errors.New("no record for this key")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, time.Now()))
}

// settings are the flags of one invocation.
type settings struct {
	name, scope, state string
	scoped             bool // -scope was given, even as "": an idemhttp or idemgrpc key
	json               bool
	timeout            time.Duration
	outcome            *resolution // resolve only
}

// commands gives each command the number of positional arguments it takes
// after its name.
var commands = map[string]int{"inspect": 1, "show": 2, "forget": 2, "resolve": 2, "sweep": 1, "check": 1, "help": 0}

// run carries out one command and returns the process's exit code.
func run(args []string, stdout, stderr io.Writer, now time.Time) int {
	var set settings
	flags := flag.NewFlagSet("idem", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	flags.StringVar(&set.name, "name", "", "")
	flags.StringVar(&set.scope, "scope", "", "")
	flags.StringVar(&set.state, "state", "", "")
	flags.BoolVar(&set.json, "json", false, "")
	flags.DurationVar(&set.timeout, "timeout", 30*time.Second, "")
	result := flags.String("result", "", "")
	errMsg := flags.String("error", "", "")
	ttl := flags.Duration("ttl", 24*time.Hour, "")
	force := flags.Bool("force", false, "")

	// Flags may come anywhere: parse, take one argument, parse again. After
	// "--" every argument is positional, such as a key that starts with "-".
	var pos []string
	for {
		if err := flags.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usage)
				return exitOK
			}
			return misuse(stderr, "", err.Error())
		}
		rest := flags.Args()
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) == 0 {
		return misuse(stderr, "", "no command given")
	}
	cmd := pos[0]
	want, known := commands[cmd]
	switch {
	case !known:
		return misuse(stderr, "", fmt.Sprintf("unknown command %q", cmd))
	case cmd == "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case len(pos)-1 != want:
		what := "WHERE"
		if want == 2 {
			what = "WHERE KEY"
		}
		return misuse(stderr, cmd, fmt.Sprintf("want %s, got %d argument(s)", what, len(pos)-1))
	case set.state != "" && cmd != "inspect", set.json && cmd != "inspect" && cmd != "show":
		return misuse(stderr, cmd, "-state goes with inspect, -json with inspect and show")
	case set.state != "" && set.state != "pending" && set.state != "interrupted" && set.state != "completed":
		return misuse(stderr, cmd, fmt.Sprintf("-state %q: want pending, interrupted or completed", set.state))
	case set.timeout <= 0:
		return misuse(stderr, cmd, "-timeout must be positive")
	}
	if cmd == "resolve" {
		var err error
		if set.outcome, err = newResolution(*result, *errMsg, *ttl); err != nil {
			return misuse(stderr, cmd, err.Error())
		}
		set.outcome.force = *force
	} else if *result != "" || *errMsg != "" || *force {
		return misuse(stderr, cmd, "-result, -error and -force go with resolve")
	}
	where, key := pos[1], ""
	if want == 2 {
		key = pos[2]
		flags.Visit(func(f *flag.Flag) { set.scoped = set.scoped || f.Name == "scope" })
		if set.scoped {
			key = idemhttp.StoreKey(set.scope, key)
		}
		if err := idem.CheckKey(key); err != nil {
			return misuse(stderr, cmd, err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), set.timeout)
	defer cancel()
	err := command(ctx, cmd, where, key, set, stdout, now)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "idem %s: %s did not answer within %s (-timeout): %v\n", cmd, display(where), set.timeout, err)
	default:
		fmt.Fprintf(stderr, "idem %s: %v\n", cmd, err)
	}
	if errors.Is(err, errNoKey) {
		return exitNoKey
	}
	return exitFailed
}

// misuse reports a command line that cannot be carried out: the reason on
// one line, and where the usage is (the whole text would bury the reason).
func misuse(stderr io.Writer, cmd, reason string) int {
	prefix := "idem"
	if cmd != "" {
		prefix += " " + cmd
	}
	fmt.Fprintf(stderr, "%s: %s\nRun 'idem help' for usage.\n", prefix, reason)
	return exitMisuse
}

func command(ctx context.Context, cmd, where, key string, set settings, w io.Writer, now time.Time) error {
	readOnly := cmd == "inspect" || cmd == "show" || cmd == "check"
	b, serverNow, closeTarget, err := openTarget(ctx, where, set.name, readOnly, w)
	if err != nil {
		return err
	}
	defer closeTarget()
	t := &tool{b: b, where: where, name: set.name, w: w, now: now, clock: "this host's clock", json: set.json, scoped: set.scoped}
	if serverNow != nil {
		// A shared backend's leases and expiries are the server's to
		// judge: a host whose clock runs ahead would call a live lease
		// lapsed, and tell the operator to forget a key in flight.
		if t.now, err = serverNow(ctx); err != nil {
			return fmt.Errorf("reading the server's clock: %w", err)
		}
		t.clock = "the server's clock"
	}
	switch cmd {
	case "inspect":
		err = t.inspect(ctx, set.state)
	case "show":
		err = t.show(ctx, key)
	case "forget":
		err = t.forget(ctx, key)
	case "resolve":
		err = t.resolve(ctx, key, set.outcome)
	case "check":
		err = t.check(ctx)
	default:
		err = t.sweep(ctx)
	}
	return explain(err, set.name)
}
