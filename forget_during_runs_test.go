package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	lc "github.com/seed094d4201/idem/internal/lifecycle"
)

// keyRuns watches one key's executions: no two at once, and none after a
// caller was told it succeeded unless an operator's Forget of the key was
// under way since.
type keyRuns struct {
	mu        sync.Mutex
	running   int
	succeeded bool // a caller was told fn succeeded, and no Forget has been under way since
	forgets   int  // Forgets under way
	gen       int  // Forgets begun
}

func (k *keyRuns) start(t *testing.T, key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running++; k.running > 1 {
		t.Errorf("%s: fn ran twice at once", key)
	}
	if k.succeeded {
		t.Errorf("%s: fn ran again after a caller was told it succeeded, with no Forget since", key)
	}
}

func (k *keyRuns) stop() { k.mu.Lock(); k.running--; k.mu.Unlock() }

// begin returns the key's Forgets begun so far, for told; -1 while one
// is under way (it may drop the outcome the call is told).
func (k *keyRuns) begin() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.forgets > 0 {
		return -1
	}
	return k.gen
}

// told notes a success told to a call that began after gen Forgets: one
// from before a later Forget began says nothing of the key now.
func (k *keyRuns) told(gen int) {
	k.mu.Lock()
	if k.forgets == 0 && k.gen == gen {
		k.succeeded = true
	}
	k.mu.Unlock()
}

func (k *keyRuns) forget(f func()) {
	k.mu.Lock()
	k.forgets++
	k.gen++
	k.succeeded = false
	k.mu.Unlock()
	f()
	k.mu.Lock()
	k.forgets--
	k.mu.Unlock()
}

// Many callers of a few keys, with two payloads, on a store stepping its
// clock both ways, while operators Forget and Sweep and the table is kept
// nearly full: no key runs twice at once or after a success was told
// (unless Forgotten meanwhile), every error is of a documented kind, the
// lifecycle is asked for no move it lacks, and at the end the store still
// admits exactly MaxKeys new keys.
func TestForgetDuringRunsRunsEachKeyOnce(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			strays, _ := lc.Strays()
			var skew atomic.Int64
			now := func() time.Time {
				if rand.IntN(10) == 0 {
					skew.Add(int64(rand.IntN(11)-5) * int64(time.Second))
				}
				return time.Now().Add(time.Duration(skew.Load()))
			}
			const max = 6
			opts := idem.Options{MaxKeys: max, TTL: time.Hour, SweepInterval: -1, Now: now,
				Logger: slog.New(slog.DiscardHandler)}
			var faults atomic.Bool
			if durable {
				faults.Store(true)
				flaky := func(op string) error {
					if faults.Load() && op != "Forget" && rand.IntN(15) == 0 {
						return errLost
					}
					return nil
				}
				opts.Backend = idemtest.Faulty{Backend: idemtest.NewMemoryBackend(), Fail: flaky, Lose: flaky}
				opts.Lease, opts.SettleTimeout = 2*time.Second, 50*time.Millisecond
			}
			s := idem.New[int](opts)
			keys := make([]keyRuns, 4)
			errTransient := errors.New("transient")
			start := time.Now()
			var wg sync.WaitGroup
			for g := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Since(start) < time.Second {
						i := rand.IntN(len(keys))
						key, k := fmt.Sprintf("k%d", i), &keys[i]
						if g < 2 { // operators
							if rand.IntN(2) == 0 {
								k.forget(func() {
									err := s.Forget(context.Background(), key)
									var be *idem.BackendError
									if err != nil && !errors.Is(err, idem.ErrKeyHeld) && !errors.As(err, &be) {
										t.Errorf("Forget(%s): %v", key, err)
									}
								})
							} else if _, err := s.Sweep(context.Background()); err != nil {
								var be *idem.BackendError
								if !errors.As(err, &be) {
									t.Errorf("Sweep: %v", err)
								}
							}
							continue
						}
						payload := "p"
						if rand.IntN(8) == 0 {
							payload = "other"
						}
						fn := func(context.Context) (int, error) {
							k.start(t, key)
							defer k.stop()
							switch rand.IntN(8) {
							case 0:
								panic("fn panicked")
							case 1:
								return 0, errTransient
							case 2:
								runtime.Goexit()
							}
							return 1, nil
						}
						ctx, cancel := context.WithCancel(context.Background())
						if rand.IntN(4) == 0 {
							go cancel()
						}
						gen := k.begin()
						err := errors.New("the calling goroutine ended")
						called := make(chan struct{})
						go func() {
							defer close(called)
							if rand.IntN(2) == 0 {
								_, err = s.RunOnce(ctx, key, payload, fn)
								return
							}
							tk, berr := s.Begin(ctx, key, payload)
							if berr != nil {
								err = berr
								return
							}
							if tk.Replayed() {
								_, err = tk.Result()
								return
							}
							defer tk.Release()
							_, err = tk.Do(fn)
						}()
						<-called
						cancel()
						var pe *idem.PanicError
						var be *idem.BackendError
						switch {
						case err == nil:
							k.told(gen)
						case errors.As(err, &pe), errors.As(err, &be), errors.Is(err, idem.ErrInProgress),
							errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, errTransient),
							errors.Is(err, idem.ErrPayloadMismatch), errors.Is(err, idem.ErrFull),
							errors.Is(err, context.Canceled), err.Error() == "the calling goroutine ended",
							strings.HasPrefix(err.Error(), "idem: fn called runtime.Goexit"):
						default:
							t.Errorf("%s: an error of no documented kind: %v", key, err)
						}
					}
				}()
			}
			wg.Wait()
			faults.Store(false)
			if n, last := lc.Strays(); n > strays {
				t.Errorf("the store asked the lifecycle for %d moves it lacks (the last: %s)", n-strays, last)
			}
			// Every key forgotten (once its pins and releases settle), the
			// store admits MaxKeys new keys and no more.
			waitFor(t, func() bool {
				for i := range keys {
					if err := s.Forget(context.Background(), fmt.Sprintf("k%d", i)); err != nil {
						return false
					}
				}
				return s.Len() == 0
			}, "every key to be forgotten")
			if durable { // what the backend holds for the keys is gone too
				for i := range keys {
					if _, ok, _ := opts.Backend.Get(context.Background(), fmt.Sprintf("k%d", i), time.Now()); ok {
						t.Errorf("k%d: the backend still holds a record after Forget", i)
					}
				}
			}
			holdsExactly(t, s, max, "after")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
