package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
)

// deadlineOnlyCtx has a deadline but no Done channel: a context that
// makes its channel lazily answers Deadline first, and a hostile one
// never makes it, or states a deadline long past.
type deadlineOnlyCtx struct {
	context.Context
	d time.Time
}

func (c deadlineOnlyCtx) Deadline() (time.Time, bool) { return c.d, true }

func misbehaveAtRandom(p int) {
	switch rand.IntN(p) {
	case 0:
		panic("observer panicked")
	case 1:
		runtime.Goexit()
	}
}

// A store in memory, then two stores sharing a backend whose calls fail or
// lose their replies, run keys through RunOnce, Begin and Steps at once,
// under a clock that steps both ways (and now and then panics or ends its
// goroutine), an Observer whose every hook may panic or call
// runtime.Goexit, MaxKeys, ExecutionTimeout, Resume, and callers whose
// contexts end at random, have a deadline but no Done channel, or one long
// past; Close races the last calls. No key's fn runs twice at once, no
// panic escapes, no call hangs, Close returns and no
// goroutine is left (an attack that held). Forget and Resolve are not
// called here: they act on a claim whose lease a clock step made lapse,
// its owner still running, as the backend judges it.
func TestEveryModeAtOnceUnderFaultsStepsAndHostileContexts(t *testing.T) {
	base := runtime.NumGoroutine()
	var chaos atomic.Bool
	chaos.Store(true)
	flaky := func(string) error {
		if chaos.Load() && rand.IntN(25) == 0 {
			return errors.New("lost")
		}
		return nil
	}
	var skew atomic.Int64
	now := func() time.Time {
		if chaos.Load() && rand.IntN(10) == 0 {
			skew.Add(int64(rand.IntN(21)-10) * int64(time.Second))
		}
		if chaos.Load() && rand.IntN(200) == 0 {
			misbehaveAtRandom(2)
		}
		return time.Now().Add(time.Duration(skew.Load()))
	}
	obs := &idem.Observer{
		Call: func(ctx context.Context, key string, o idem.Outcome, took time.Duration) {
			if chaos.Load() {
				misbehaveAtRandom(10)
			}
		},
		Executing: func(ctx context.Context, delta int) {
			if chaos.Load() {
				misbehaveAtRandom(20)
			}
		},
		Span: func(ctx context.Context, phase, key string) (context.Context, func(error)) {
			if chaos.Load() {
				misbehaveAtRandom(20)
			}
			return ctx, func(error) {
				if chaos.Load() {
					misbehaveAtRandom(20)
				}
			}
		},
		NotRecorded: func(ctx context.Context, key string, err error) {
			if chaos.Load() {
				misbehaveAtRandom(10)
			}
		},
	}
	mem := idemtest.NewMemoryBackend()
	b := idemtest.Faulty{Backend: mem, Fail: flaky, Lose: flaky}
	mk := []func() idem.Options{
		func() idem.Options {
			return idem.Options{TTL: time.Hour, MaxKeys: 6, ExecutionTimeout: 30 * time.Millisecond, SweepInterval: 5 * time.Millisecond, Now: now, Observer: obs, Logger: slog.New(slog.DiscardHandler)}
		},
		func() idem.Options {
			return idem.Options{TTL: time.Hour, MaxKeys: 6, ExecutionTimeout: 30 * time.Millisecond, Backend: b, Resume: true, Lease: 2 * time.Second, SettleTimeout: 100 * time.Millisecond, SweepInterval: 5 * time.Millisecond, Now: now, Observer: obs, Logger: slog.New(slog.DiscardHandler)}
		},
	}
	for mi, m := range mk {
		s := idem.New[int](m())
		s2 := s
		if mi == 1 {
			o := m()
			o.Resume = false
			o.RetryInterrupted = true
			s2 = idem.New[int](o)
		}
		var running sync.Map
		var wg sync.WaitGroup
		start := time.Now()
		stopCalls := make(chan struct{})
		for w := range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if v := recover(); v != nil {
						t.Errorf("panic escaped: %v", v)
					}
				}()
				for i := 0; ; i++ {
					select {
					case <-stopCalls:
						return
					default:
					}
					key := fmt.Sprintf("k%d-%d", rand.IntN(8), time.Since(start)/(50*time.Millisecond))
					rv, _ := running.LoadOrStore(key, new(atomic.Int32))
					runs := rv.(*atomic.Int32)
					fn := func(ctx context.Context) (int, error) {
						if runs.Add(1) != 1 {
							t.Errorf("%s: fn ran twice at once", key)
						}
						defer runs.Add(-1)
						_, _ = idem.Step(ctx, "a", func(context.Context) (int, error) {
							if rand.IntN(10) == 0 {
								runtime.Goexit()
							}
							return 1, nil
						})
						if rand.IntN(3) == 0 {
							select {
							case <-ctx.Done():
							case <-time.After(time.Duration(rand.IntN(40)) * time.Millisecond):
							}
						}
						switch rand.IntN(8) {
						case 0:
							panic("fn")
						case 1:
							return 0, errors.New("transient")
						case 2:
							runtime.Goexit()
						case 3:
							return 0, idem.Final(errors.New("declined"))
						}
						return w, nil
					}
					var ctx context.Context = context.Background()
					var cancel context.CancelFunc = func() {}
					switch rand.IntN(5) {
					case 0:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(20))*time.Millisecond)
					case 1:
						ctx = deadlineOnlyCtx{ctx, time.Now().Add(-time.Hour)}
					case 2:
						ctx = deadlineOnlyCtx{ctx, time.Now().Add(time.Hour)}
					case 3:
						ctx, cancel = context.WithCancel(ctx)
						go func() { time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond); cancel() }()
					}
					done := make(chan struct{})
					s := s
					if rand.IntN(2) == 0 {
						s = s2
					}
					go func() {
						defer close(done)
						switch rand.IntN(5) {
						case 0:
							tk, err := s.Begin(ctx, key, "p")
							if err != nil || tk.Replayed() {
								return
							}
							defer tk.Release()
							if rand.IntN(5) == 0 {
								return
							}
							_, _ = tk.Do(fn)
						default:
							_, _ = s.RunOnce(ctx, key, "p", fn)
						}
					}()
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						t.Errorf("mode %d: a call hung", mi)
						return
					}
					cancel()
				}
			}()
		}
		time.Sleep(1500 * time.Millisecond)
		closed := make(chan error, 2)
		go func() { closed <- s.Close() }()
		go func() { closed <- s2.Close() }()
		time.Sleep(50 * time.Millisecond)
		close(stopCalls)
		select {
		case <-closed:
			<-closed
		case <-time.After(20 * time.Second):
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("mode %d: Close hung\n%s", mi, buf[:n])
		}
		wg.Wait()
	}
	chaos.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		runtime.GC()
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		buf := make([]byte, 1<<20)
		k := runtime.Stack(buf, true)
		t.Fatalf("goroutines: %d, base %d\n%s", n, base, buf[:k])
	}
}
