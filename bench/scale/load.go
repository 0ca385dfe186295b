package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
)

const (
	valueSize   = 300 // bytes of result per key, about what the issue measured with
	callers     = 64  // concurrent callers during a fill
	loaders     = 16  // concurrent callers claiming new keys during a sweep
	phaseLength = 5 * time.Second
)

// fillHalves remembers keys new keys in b: the first half with a TTL
// that lapses while the fill runs (swept later), the second for a day.
func fillHalves(ctx context.Context, b backend.Backend, keys int) error {
	short := idem.New[[]byte](idem.Options{Backend: b, TTL: time.Second, SweepInterval: -1})
	defer short.Close()
	long := idem.New[[]byte](idem.Options{Backend: b, TTL: 24 * time.Hour, SweepInterval: -1})
	defer long.Close()
	value := make([]byte, valueSize)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	start := time.Now()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= keys {
					return
				}
				s := long
				if i < keys/2 {
					s = short
				}
				if _, err := s.RunOnce(ctx, "fill-"+strconv.Itoa(i), nil, func(context.Context) ([]byte, error) { return value, nil }); err != nil {
					errs <- err
					return
				}
				if i%100_000 == 0 && i > 0 {
					fmt.Printf("  filled %d keys in %v\n", i, time.Since(start).Round(time.Second))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	d := time.Since(start)
	fmt.Printf("fill: %d keys in %v (%.0f keys/s)\n", keys, d.Round(time.Second), float64(keys)/d.Seconds())
	return nil
}

// load claims new keys with loaders callers until stop is closed,
// counting them in made; it returns once they have all stopped, with the
// first error one met.
func load(ctx context.Context, b backend.Backend, made *atomic.Int64, stop <-chan struct{}) error {
	s := idem.New[[]byte](idem.Options{Backend: b, TTL: 24 * time.Hour, SweepInterval: -1})
	defer s.Close()
	value := make([]byte, valueSize)
	var failed atomic.Value
	var wg sync.WaitGroup
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	for g := range loaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("load-%s-%d-%d", prefix, g, i)
				if _, err := s.RunOnce(ctx, key, nil, func(context.Context) ([]byte, error) { return value, nil }); err != nil {
					failed.Store(err)
					return
				}
				made.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return err
	}
	return nil
}

// phase prints the rate of new keys, and the bytes this process wrote per
// new key (wchar: the write system calls' bytes, whatever the file
// system), while during runs.
func phase(name string, made *atomic.Int64, during func() error) error {
	n0, w0, t0 := made.Load(), wchar(), time.Now()
	if err := during(); err != nil {
		return err
	}
	n, w, d := made.Load()-n0, wchar()-w0, time.Since(t0)
	fmt.Printf("%s: %v, %d new keys (%.0f keys/s), %.0f bytes written per new key\n", name, d.Round(time.Millisecond), n, float64(n)/d.Seconds(), float64(w)/float64(max(n, 1)))
	return nil
}

// wait is a phase's length of load.
func wait() error { time.Sleep(phaseLength); return nil }

// newKeysFor measures new keys under load for one phase.
func newKeysFor(ctx context.Context, b backend.Backend, name string) error {
	var made atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- load(ctx, b, &made, stop) }()
	err := phase(name, &made, wait)
	close(stop)
	return errors.Join(err, <-done)
}

// sweepUnderLoad claims new keys for a phase, then sweeps what expired
// while they go on, then claims for a phase more.
func sweepUnderLoad(ctx context.Context, b backend.Backend, size func() int64) error {
	sweeper := idem.New[[]byte](idem.Options{Backend: b, SweepInterval: -1})
	defer sweeper.Close()
	var made atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- load(ctx, b, &made, stop) }()
	before := size()
	err := phase("new keys before the sweep", &made, wait)
	if err == nil {
		err = phase("new keys during the sweep", &made, func() error {
			swept, err := sweeper.Sweep(ctx)
			fmt.Printf("  swept %d expired keys\n", swept)
			return err
		})
	}
	if err == nil {
		err = phase("new keys after the sweep", &made, wait)
	}
	close(stop)
	err = errors.Join(err, <-done)
	fmt.Printf("size before the sweep %d MB, after %d MB\n", before>>20, size()>>20)
	return err
}

// report prints a size and its share per key.
func report(what string, bytes int64, keys int) {
	fmt.Printf("%s: %d MB, %.0f B per key\n", what, bytes>>20, float64(bytes)/float64(keys))
}

// wchar is the bytes this process has passed to write system calls.
func wchar() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
