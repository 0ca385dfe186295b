package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// isolated runs f on a goroutine of its own and reports how it ended: a
// panic that escaped f (nil if none), and whether f's goroutine was ended
// by runtime.Goexit.
func isolated(f func()) (escaped any, exited bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		returned := false
		defer func() {
			if !returned {
				escaped = recover()
				exited = escaped == nil
			}
		}()
		f()
		returned = true
	}()
	<-done
	return escaped, exited
}

// misbehave panics or ends the goroutine, as foreign code may.
func misbehave(how, op string) {
	if how == "panic" {
		panic(fmt.Sprintf("%s panicked", op))
	}
	runtime.Goexit()
}

// A Backend that panics or ends the goroutine in any method, after its
// write landed, on the caller's goroutine or on one of the store's own:
// no panic escapes the library, the process goes on, and the key is not
// left stuck: once the Backend behaves, the key runs or replays, and
// Close returns.
func TestBackendThatPanicsOrExitsStrandsNothing(t *testing.T) {
	type scenario struct {
		op  string
		run func(t *testing.T, s *idem.Store[order], other *idem.Store[order])
	}
	ok := func(context.Context) (order, error) { return order{ID: 1}, nil }
	boom := errors.New("before commit")
	scenarios := []scenario{
		{"Claim", func(t *testing.T, s, _ *idem.Store[order]) {
			_, _ = s.RunOnce(context.Background(), "k", "p", ok)
		}},
		{"Complete", func(t *testing.T, s, _ *idem.Store[order]) { // on the caller's goroutine
			_, _ = s.RunOnce(context.Background(), "k", "p", ok)
		}},
		{"Complete", func(t *testing.T, s, _ *idem.Store[order]) { // on RunOnce's own goroutine
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _ = s.RunOnce(ctx, "k", "p", ok)
		}},
		{"Release", func(t *testing.T, s, _ *idem.Store[order]) {
			_, _ = s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{}, boom })
		}},
		{"Get", func(t *testing.T, s, other *idem.Store[order]) { // polling a key another store holds
			hold, held := make(chan struct{}), make(chan struct{})
			go func() {
				_, _ = other.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) {
					close(held)
					<-hold
					return order{ID: 1}, nil
				})
			}()
			<-held
			defer close(hold)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = s.RunOnce(ctx, "k", "p", ok)
		}},
		{"Renew", func(t *testing.T, s, _ *idem.Store[order]) { // on the lease's timer goroutine
			_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (order, error) {
				<-renewed
				return order{ID: 1}, nil
			})
		}},
		{"Forget", func(t *testing.T, s, _ *idem.Store[order]) {
			_, err := s.RunOnce(context.Background(), "k", "p", ok)
			require.NoError(t, err)
			_ = s.Forget(context.Background(), "k")
		}},
		{"Sweep", func(t *testing.T, s, _ *idem.Store[order]) {
			_, _ = s.Sweep(context.Background())
		}},
	}
	for _, how := range []string{"panic", "goexit"} {
		for i, sc := range scenarios {
			t.Run(fmt.Sprintf("%s/%s/%d", how, sc.op, i), func(t *testing.T) {
				var armed atomic.Bool
				armed.Store(true)
				renewed = make(chan struct{})
				var renewedOnce atomic.Bool
				mem := idemtest.NewMemoryBackend()
				b := idemtest.Faulty{Backend: mem, Lose: func(op string) error {
					if op == "Renew" && renewedOnce.CompareAndSwap(false, true) {
						defer close(renewed)
					}
					if op == sc.op && armed.CompareAndSwap(true, false) {
						misbehave(how, op)
					}
					return nil
				}}
				opts := idem.Options{Backend: b, Lease: 60 * time.Millisecond, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)}
				s := idem.New[order](opts)
				other := idem.New[order](idem.Options{Backend: mem, Logger: slog.New(slog.DiscardHandler)})
				defer closeWithin(t, other, 5*time.Second)
				escaped, _ := isolated(func() { sc.run(t, s, other) })
				require.Nil(t, escaped, "a panic escaped the library")

				// The Backend behaves again: the key runs or replays.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				got, err := s.RunOnce(ctx, "k", "p", ok)
				require.NoError(t, err, "the key was left stuck")
				assert.Equal(t, order{ID: 1}, got)
				closeWithin(t, s, 5*time.Second)
			})
		}
	}
}

// renewed is closed once a scenario's first Renew has been made.
var renewed chan struct{}

// A background release (of a claim whose fate a lost reply left unknown)
// whose Backend ends the releaser's goroutine does not end the releases:
// the claim is released once the Backend behaves, and the key runs again.
func TestReleaserThatExitsGoesOn(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	var failing, exited atomic.Bool
	failing.Store(true)
	b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		switch {
		case op != "Release":
		case failing.Load():
			return errLost // the failed run's own release: left to the releaser
		case exited.CompareAndSwap(false, true):
			runtime.Goexit() // the releaser's next try
		}
		return nil
	}}
	s := idem.New[order](idem.Options{Backend: b, SettleTimeout: 30 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer closeWithin(t, s, 5*time.Second)
	boom := errors.New("before commit")
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{}, boom })
	require.ErrorIs(t, err, boom)
	failing.Store(false)
	require.Eventually(t, func() bool {
		_, found, _ := mem.Get(context.Background(), "k", time.Now())
		return !found
	}, 10*time.Second, 5*time.Millisecond, "the claim was never released")
	assert.True(t, exited.Load())
}

// A custom Fingerprint that panics is an invalid payload; one that ends
// the goroutine claims nothing. Either way the key stays usable.
func TestFingerprintThatPanicsOrExits(t *testing.T) {
	for _, how := range []string{"panic", "goexit"} {
		t.Run(how, func(t *testing.T) {
			var armed atomic.Bool
			armed.Store(true)
			s := idem.New[order](idem.Options{Backend: idemtest.NewMemoryBackend(), Fingerprint: func(p any) (idem.Fingerprint, error) {
				if armed.CompareAndSwap(true, false) {
					misbehave(how, "Fingerprint")
				}
				return idem.DefaultFingerprint(p)
			}})
			defer closeWithin(t, s, 5*time.Second)
			var err error
			escaped, exited := isolated(func() {
				_, err = s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{ID: 1}, nil })
			})
			require.Nil(t, escaped)
			if how == "panic" {
				require.ErrorIs(t, err, idem.ErrInvalidPayload)
			} else {
				require.True(t, exited)
			}
			got, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (order, error) { return order{ID: 1}, nil })
			require.NoError(t, err)
			assert.Equal(t, order{ID: 1}, got)
		})
	}
}

// armedOnce misbehaves (panic or Goexit) the first time op is picked.
type armedOnce struct {
	how, op string
	armed   atomic.Bool
	hit     atomic.Bool // it misbehaved
}

func newArmed(how, op string) *armedOnce {
	a := &armedOnce{how: how, op: op}
	a.armed.Store(true)
	return a
}

func (a *armedOnce) at(op string) {
	if op == a.op && a.armed.CompareAndSwap(true, false) {
		a.hit.Store(true)
		misbehave(a.how, op)
	}
}

// armedCodec is JSON, misbehaving where a picks.
type armedCodec struct{ a *armedOnce }

func (c armedCodec) Marshal(v any) ([]byte, error) {
	c.a.at("Marshal")
	return idem.JSONCodec{}.Marshal(v)
}

func (c armedCodec) Unmarshal(data []byte, v any) error {
	c.a.at("Unmarshal")
	return idem.JSONCodec{}.Unmarshal(data, v)
}

// The Codec, the Observer and the Backend's optional interfaces (Stepper,
// Lister), each panicking or ending the goroutine at each of their
// methods, on the caller's goroutine and on RunOnce's own: no panic
// escapes, and the key answers afterwards (replays or runs).
func TestForeignCodeThatPanicsOrExitsStrandsNothing(t *testing.T) {
	ops := []string{"Marshal", "Unmarshal", "Call", "Executing", "Span", "Span's end", "RecordStep", "Resume", "Each"}
	for _, how := range []string{"panic", "goexit"} {
		for _, op := range ops {
			for _, detached := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/detached=%v", how, op, detached), func(t *testing.T) {
					a := newArmed(how, op)
					mem := idemtest.NewMemoryBackend()
					// Faulty's Stepper and Lister methods have no Lose.
					b := idemtest.Faulty{Backend: mem, Fail: func(op string) error {
						if op == "RecordStep" || op == "Resume" || op == "Each" {
							a.at(op)
						}
						return nil
					}}
					obs := &idem.Observer{
						Call:      func(context.Context, string, idem.Outcome, time.Duration) { a.at("Call") },
						Executing: func(context.Context, int) { a.at("Executing") },
						Span: func(ctx context.Context, _, _ string) (context.Context, func(error)) {
							a.at("Span")
							return ctx, func(error) { a.at("Span's end") }
						},
					}
					s := idem.New[order](idem.Options{Backend: b, Codec: armedCodec{a}, Observer: obs, Resume: true,
						Lease: 60 * time.Millisecond, SettleTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
					ctx := context.Background()
					if detached {
						c, cancel := context.WithCancel(ctx)
						defer cancel()
						ctx = c
					}
					boom := errors.New("after a step")
					for i := range 3 { // a step recorded, a failure, a resume; then a replay
						escaped, _ := isolated(func() {
							_, _ = s.RunOnce(ctx, "k", "p", func(ctx context.Context) (order, error) {
								if _, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
									return order{}, err
								}
								if i == 0 {
									return order{}, boom
								}
								return order{ID: 1}, nil
							})
						})
						require.Nil(t, escaped, "a panic escaped the library")
					}
					escaped, _ := isolated(func() {
						for range s.Records(context.Background()) {
						}
					})
					require.Nil(t, escaped, "a panic escaped the library")
					// Whatever happened, the key answers: the outcome.
					ctx2, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					got, err := s.RunOnce(ctx2, "k", "p", func(context.Context) (order, error) { return order{ID: 1}, nil })
					require.NoError(t, err, "the key was left stuck")
					assert.Equal(t, order{ID: 1}, got)
					closeWithin(t, s, 5*time.Second)
					assert.True(t, a.hit.Load(), "%s was never called", op)
				})
			}
		}
	}
}
