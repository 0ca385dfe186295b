package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem"
	"golang.org/x/sync/singleflight"
)

type receipt struct {
	Charge int64
	Amount int64
}

// payload is the request every benchmark sends: 100 bytes.
var payload = func() []byte {
	b := make([]byte, 100)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}()

// boxed is payload as an any, boxed once so the loops measure the store.
var boxed any = payload

// makeKeys returns n distinct 36-character UUID-like keys.
func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		x := uint64(i) * 0x9e3779b97f4a7c15
		keys[i] = fmt.Sprintf("%08x-%04x-4%03x-a%03x-%012x", uint32(x>>32), uint16(x>>16), i&0xfff, (i>>12)&0xfff, uint64(i)&0xffffffffffff)
	}
	return keys
}

// goroutines are the concurrency levels each benchmark runs at; 1 is a plain
// serial loop.
var goroutines = []int{1, 2, 16}

// forEach calls op(i) for i in [0, b.N), serially when g is 1, otherwise from
// g goroutines through b.RunParallel. Besides wall time it reports
// cpu-ns/op, the CPU time the whole process used per op: on a machine
// shared with other work, wall time counts the time this process waited
// for a core, and CPU time does not (while it still counts what a
// goroutine hand-off costs the scheduler and what the collector does).
func forEach(b *testing.B, g int, op func(i int)) {
	b.ReportAllocs()
	b.ResetTimer()
	if start, ok := cpuTime(); ok {
		defer func() {
			if end, ok := cpuTime(); ok {
				b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
			}
		}()
	}
	if g == 1 {
		for i := range b.N {
			op(i)
		}
		return
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((g + procs - 1) / procs)
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			op(int(next.Add(1) - 1))
		}
	})
}

// impl is one way to run an operation once per key.
type impl struct {
	name string
	// new returns the operation for key and a cleanup. keys is sized for
	// the run, for implementations that want to prefill.
	new func() (do func(key string), cleanup func())
}

var fnReceipt = receipt{Charge: 1, Amount: 450}

var impls = []impl{
	{"idem", func() (func(string), func()) {
		s := idem.New[receipt](idem.Options{})
		ctx := context.Background()
		fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
		return func(key string) {
			if _, err := s.RunOnce(ctx, key, boxed, fn); err != nil {
				panic(err)
			}
		}, func() { s.Close() }
	}},
	{"mutexmap", func() (func(string), func()) {
		mm := newMutexMap()
		fn := func() (receipt, error) { return fnReceipt, nil }
		return func(key string) {
			if _, err := mm.do(key, payload, fn); err != nil {
				panic(err)
			}
		}, func() {}
	}},
	{"singleflight", func() (func(string), func()) {
		var g singleflight.Group
		fn := func() (any, error) { return fnReceipt, nil }
		return func(key string) {
			if _, err := singleflightDo(&g, key, payload, fn); err != nil {
				panic(err)
			}
		}, func() {}
	}},
}

// idemDetached is idem called with a context that can be cancelled, so fn
// runs on its own goroutine and the caller waits on a channel: the price of
// letting a caller leave while the execution goes on.
var idemDetached = impl{"idem-cancellable-ctx", func() (func(string), func()) {
	s := idem.New[receipt](idem.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	fn := func(context.Context) (receipt, error) { return fnReceipt, nil }
	return func(key string) {
			if _, err := s.RunOnce(ctx, key, boxed, fn); err != nil {
				panic(err)
			}
		}, func() {
			cancel()
			s.Close()
		}
}}

// mutexmapDetached is the mutex map with fn on a goroutine of its own and
// the caller waiting under a context that can be cancelled: the floor for
// idem-cancellable-ctx, whose caller may leave while fn goes on.
var mutexmapDetached = impl{"mutexmap-cancellable-ctx", func() (func(string), func()) {
	mm := newMutexMap()
	ctx, cancel := context.WithCancel(context.Background())
	fn := func() (receipt, error) { return fnReceipt, nil }
	return func(key string) {
		if _, err := mm.doDetached(ctx, key, payload, fn); err != nil {
			panic(err)
		}
	}, cancel
}}

// idemBegin is idem's two phases: Begin, then Finish with fn's outcome, as
// a queue consumer or an adapter calls them.
var idemBegin = impl{"idem-begin-finish", func() (func(string), func()) {
	s := idem.New[receipt](idem.Options{})
	ctx := context.Background()
	return func(key string) {
			t, err := s.Begin(ctx, key, boxed)
			if err != nil {
				panic(err)
			}
			if t.Replayed() {
				return
			}
			if _, err := t.Finish(fnReceipt, nil); err != nil {
				panic(err)
			}
		}, func() {
			s.Close()
		}
}}

// BenchmarkNewKey runs every operation on a key never seen before: claim,
// fingerprint, run fn (which returns at once), record and keep. Every
// implementation grows to b.N keys, so compare runs with one -benchtime=Nx.
func BenchmarkNewKey(b *testing.B) {
	for _, im := range append(impls, idemDetached, mutexmapDetached, idemBegin) {
		for _, g := range goroutines {
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				keys := makeKeys(b.N)
				do, cleanup := im.new()
				defer cleanup()
				forEach(b, g, func(i int) { do(keys[i]) })
			})
		}
	}
}

// replayKeys is how many completed keys the replay benchmarks cycle through.
const replayKeys = 4096

// BenchmarkReplay repeats operations whose outcome is already recorded.
// singleflight keeps nothing, so it has no replay to compare.
func BenchmarkReplay(b *testing.B) {
	for _, im := range impls[:2] {
		for _, g := range goroutines {
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				keys := makeKeys(replayKeys)
				do, cleanup := im.new()
				defer cleanup()
				for _, k := range keys {
					do(k)
				}
				forEach(b, g, func(i int) { do(keys[i%replayKeys]) })
			})
		}
	}
}

// BenchmarkHotKey sends every operation, from every goroutine, with one key:
// after the first, idem and the mutex map replay it, while singleflight
// coalesces whatever overlaps and runs fn again for the rest.
func BenchmarkHotKey(b *testing.B) {
	for _, im := range impls {
		for _, g := range goroutines[1:] {
			b.Run(fmt.Sprintf("impl=%s/g=%d", im.name, g), func(b *testing.B) {
				do, cleanup := im.new()
				defer cleanup()
				const key = "16fd2706-8baf-433b-82eb-8c7fada847da"
				do(key)
				forEach(b, g, func(int) { do(key) })
			})
		}
	}
}
