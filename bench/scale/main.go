// Command scale measures each backend at a million keys: it fills a store
// to -keys remembered keys, times a start after a clean and after an
// unclean stop, sweeps half of the keys while new keys are claimed, and
// reports the sizes and write costs before and after. The figures it prints
// are the ones in bench/README.md, section "At scale".
//
//	go run ./bench/scale -backend bolt -keys 1000000
//
// Each backend's measurement lives in a file of its own (bolt.go,
// postgres.go, redis.go, sqlite.go) and registers itself in init.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// config is what every measurement is given.
type config struct {
	keys int    // keys to fill the store with
	dir  string // a directory for files (bolt, sqlite)
}

// measurements maps a backend's name to its measurement; each file's init
// adds one.
var measurements = map[string]func(ctx context.Context, c config) error{}

// children maps a backend's name to what a child process run with -child
// does: hold claims in the store -dir names until it is killed, so that
// the parent can time a start after an unclean stop.
var children = map[string]func(target string) error{}

func main() {
	var names []string
	for n := range measurements {
		names = append(names, n)
	}
	slices.Sort(names)
	name := flag.String("backend", "", "the backend to measure: "+strings.Join(names, ", "))
	keys := flag.Int("keys", 1_000_000, "keys to fill the store with")
	dir := flag.String("dir", "", "a directory for the files (default: a new temporary one)")
	child := flag.String("child", "", "")
	flag.Parse()
	if *child != "" {
		if err := children[*child](*dir); err != nil {
			fmt.Fprintln(os.Stderr, "scale child:", err)
			os.Exit(1)
		}
		return
	}
	run, ok := measurements[*name]
	if !ok {
		fmt.Fprintf(os.Stderr, "scale: -backend must be one of %s\n", strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(measure(run, config{keys: *keys, dir: *dir}))
}

// measure runs one measurement and returns the exit code: the temporary
// directory it may make is removed on every path.
func measure(run func(context.Context, config) error, c config) int {
	if c.dir == "" {
		d, err := os.MkdirTemp("", "idem-scale-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			return 1
		}
		defer os.RemoveAll(d)
		c.dir = d
	}
	start := time.Now()
	if err := run(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	fmt.Printf("total %s\n", time.Since(start).Round(time.Second))
	return 0
}
