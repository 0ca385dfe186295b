package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hsBackends are the Steppers the table tests run on: one in memory, one
// in a file.
var hsBackends = []struct {
	name string
	b    func(t *testing.T) backend.Backend
}{
	{"memory", func(*testing.T) backend.Backend { return idemtest.NewMemoryBackend() }},
	{"bolt", func(t *testing.T) backend.Backend { return hsOpenBolt(t) }},
}

// hsOpenBolt opens a bolt file closed when the test ends.
func hsOpenBolt(t *testing.T) *bolt.Backend {
	t.Helper()
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// hsStore returns a store closed when the test ends (before its backend,
// whose cleanup was registered first).
func hsStore[R any](t *testing.T, opts idem.Options) *idem.Store[R] {
	t.Helper()
	s := idem.New[R](opts)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// hsAtRecoveryPoint leaves key at a recovery point: one step "a" recorded
// (returning 1), then an ordinary error.
func hsAtRecoveryPoint(t *testing.T, s *idem.Store[string], key, payload string) {
	t.Helper()
	_, err := s.RunOnce(context.Background(), key, payload, func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		return "", errors.New("transient: stop at the recovery point")
	})
	require.Error(t, err)
	require.False(t, idem.IsFinal(err))
}

// Step's doc: "A name is one step: the same name twice in one operation
// returns the first call's outcome." Two goroutines of one fn calling the
// same step at once must not both run it: that is the double side effect
// (a card charged twice under one derived key that the bank may or may not
// dedupe) the whole API exists to prevent.
func TestHostileStepConcurrentSameNameRunsOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts idem.Options
	}{
		{"memory-only", idem.Options{}},
		{"resume", idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hsStore[int](t, tc.opts)
			var runs atomic.Int32
			entered, release := make(chan struct{}), make(chan struct{})
			charge := func(ctx context.Context) (int, error) {
				if runs.Add(1) == 1 {
					close(entered)
					<-release
				}
				return 42, nil
			}
			_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (int, error) {
				first := make(chan error, 1)
				go func() { _, err := idem.Step(ctx, "charge", charge); first <- err }()
				<-entered
				second := make(chan error, 1)
				go func() { _, err := idem.Step(ctx, "charge", charge); second <- err }()
				// The second call may not return before the first's fn has:
				// a second run of the step returns at once.
				deadline := time.Now().Add(300 * time.Millisecond)
				for time.Now().Before(deadline) && runs.Load() == 1 {
					time.Sleep(time.Millisecond) // polling a condition with a deadline
				}
				close(release)
				return 0, errors.Join(<-first, <-second)
			})
			require.NoError(t, err)
			assert.Equal(t, int32(1), runs.Load(), "the step ran once for two concurrent calls of one name")
		})
	}
}

// Without recording (no Backend, or Resume off) Step records nothing, so
// it has no business encoding the result: a result the Codec cannot encode
// (NaN in JSON, a channel) must come back as fn returned it, without an
// error. Today Step encodes it anyway and turns a step whose side effect
// happened into a failure, so the caller fails and retries the side effect.
func TestHostileStepUnencodableResultWithoutRecording(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts idem.Options
	}{
		{"memory-only", idem.Options{}},
		{"backend-without-resume", idem.Options{Backend: idemtest.NewMemoryBackend()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hsStore[float64](t, tc.opts)
			var stepErr error
			got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (float64, error) {
				_, err := idem.Step(ctx, "measure", func(context.Context) (float64, error) { return math.NaN(), nil })
				stepErr = err
				return 1, nil
			})
			require.NoError(t, err)
			assert.Equal(t, 1.0, got)
			assert.NoError(t, stepErr, "Step records nothing here; it must not fail on encoding")
		})
	}
}

// A step whose fn returned a Final error ("card declined") with a result
// the Codec cannot encode: Step must still return that final error (the
// caller decides on it), joined with the encoding failure if it likes.
// Today the final error is dropped and only the encoding error returned.
func TestHostileStepFinalErrorKeptWhenValueUnencodable(t *testing.T) {
	s := hsStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	declined := errors.New("card declined")
	var stepErr error
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, stepErr = idem.Step(ctx, "charge", func(context.Context) (float64, error) {
			return math.Inf(1), idem.Final(declined)
		})
		return "", stepErr
	})
	require.Error(t, stepErr)
	assert.ErrorIs(t, stepErr, declined, "the step's own final error is not lost")
}

// hsPanicky's MarshalJSON panics.
type hsPanicky struct{}

func (hsPanicky) MarshalJSON() ([]byte, error) { panic("MarshalJSON exploded") }

// The library's rule (durable.go, marshal): a panic in the Codec is
// returned as an error, "so that it can neither leave a key claimed nor
// escape the library". Step calls op.codec.Marshal directly: with a
// Ticket (no RunOnce recover around the work), the panic escapes to the
// caller of Step.
func TestHostileStepCodecPanicDoesNotEscape(t *testing.T) {
	s := hsStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	defer tk.Release()
	var (
		stepErr  error
		panicked any
	)
	func() {
		defer func() { panicked = recover() }()
		_, stepErr = idem.Step(tk.Context(), "s", func(context.Context) (hsPanicky, error) { return hsPanicky{}, nil })
	}()
	assert.Nil(t, panicked, "a Codec panic escaped Step")
	assert.Error(t, stepErr)
	_, _ = tk.Finish("", errors.New("done"))
}

// Options.Now is documented as the clock for a backend local to the
// process (bolt), and tests are told to inject a fake clock there instead
// of sleeping. finishDurable "makes the lease lapse now" by renewing it to
// 1ns, which only lapses once that clock moves: with a clock that does not
// move by itself, the retry after an ordinary error finds the key in
// flight and waits until its ctx ends, instead of resuming.
func TestHostileResumeAfterErrorWithFakeClock(t *testing.T) {
	for _, tc := range hsBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := hsStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now})
			hsAtRecoveryPoint(t, s, "k", "p")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var reran atomic.Bool
			got, err := s.RunOnce(ctx, "k", "p", func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 2, nil })
				return fmt.Sprint(v), err
			})
			require.NoError(t, err, "the retry resumes at once, as the README promises")
			assert.Equal(t, "1", got)
			assert.False(t, reran.Load())
		})
	}
}

// Two stores over one bolt file, four callers each, all retrying one key
// at its recovery point at once: exactly one resumes, the recorded step
// never runs again, the next step runs once, everyone gets its outcome.
func TestHostileTwoStoresResumeAtOnce(t *testing.T) {
	b := hsOpenBolt(t)
	stores := []*idem.Store[string]{
		hsStore[string](t, idem.Options{Backend: b, Resume: true}),
		hsStore[string](t, idem.Options{Backend: b, Resume: true}),
	}
	hsAtRecoveryPoint(t, stores[0], "k", "p")
	var aRuns, bRuns, bodies atomic.Int32
	fn := func(ctx context.Context) (string, error) {
		bodies.Add(1)
		a, err := idem.Step(ctx, "a", func(context.Context) (int, error) { aRuns.Add(1); return 9, nil })
		if err != nil {
			return "", err
		}
		c, err := idem.Step(ctx, "b", func(context.Context) (string, error) { bRuns.Add(1); return idem.StepKey(ctx), nil })
		return fmt.Sprint(a, "/", c), err
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan outcomeHS, 8)
	for i := range 8 {
		wg.Add(1)
		go func(s *idem.Store[string]) {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, err := s.RunOnce(ctx, "k", "p", fn)
			results <- outcomeHS{v, err}
		}(stores[i%2])
	}
	close(start)
	wg.Wait()
	close(results)
	var first string
	for r := range results {
		require.NoError(t, r.err)
		if first == "" {
			first = r.val
		}
		assert.Equal(t, first, r.val)
	}
	assert.Equal(t, int32(0), aRuns.Load(), "the recorded step never ran again")
	assert.Equal(t, int32(1), bRuns.Load(), "the next step ran once")
	assert.Equal(t, int32(1), bodies.Load(), "one resumed execution")
}

type outcomeHS struct {
	val string
	err error
}

// A key at its recovery point, retried with another payload, is
// ErrPayloadMismatch, not a resume; the right payload then resumes.
func TestHostileResumeOtherPayloadIsMismatch(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true, RetryInterrupted: true})
	hsAtRecoveryPoint(t, s, "k", "p")
	called := false
	_, err := s.RunOnce(context.Background(), "k", "other", func(context.Context) (string, error) { called = true; return "", nil })
	assert.ErrorIs(t, err, idem.ErrPayloadMismatch)
	assert.False(t, called)
	// Resume with RetryInterrupted also set: resumed, the step not rerun.
	got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 5, nil })
		return fmt.Sprint(v), err
	})
	require.NoError(t, err)
	assert.Equal(t, "1", got)
}

// A stale owner whose lease lapsed (by the store's clock) and whose key
// another store resumed can neither record a step nor complete: the
// resumer's outcome stands.
func TestHostileStaleOwnerAfterResume(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	// The stale owner is cut off from the backend (its renewals fail), so
	// that, once the clock steps past its lease, the other store sees the
	// lapsed claim go unrenewed and takes it over (a live owner's renewal
	// would keep it: TestClockStepForwardDoesNotTakeALiveOwnersKey).
	opts := idem.Options{Backend: mem, Resume: true, Now: clock.Now, Lease: 300 * time.Millisecond}
	fresh := hsStore[string](t, opts)
	var un idemtest.Unrecorded
	opts.Observer = un.Observer()
	opts.Backend = idemtest.Faulty{Backend: mem, Fail: func(op string) error {
		if op == "Renew" {
			return errors.New("partitioned")
		}
		return nil
	}}
	stale := hsStore[string](t, opts)
	atGate, wake := make(chan struct{}), make(chan struct{})
	var lateStep error
	done := make(chan outcomeHS, 1)
	go func() {
		v, err := stale.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return "", err
			}
			close(atGate)
			<-wake
			_, lateStep = idem.Step(ctx, "late", func(context.Context) (int, error) { return 1, nil })
			return "stale", nil
		})
		done <- outcomeHS{v, err}
	}()
	<-atGate
	clock.Advance(2 * time.Hour) // the stale owner's lease lapsed
	got, err := fresh.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return "fresh", err
	})
	require.NoError(t, err)
	assert.Equal(t, "fresh", got)
	close(wake)
	r := <-done
	// Refused: its trust ended before the other store took the key over
	// (TestPartitionedOwnerKeepsItsKeyThroughAClockStep), or the backend
	// refuses its token.
	assert.True(t, errors.Is(lateStep, idem.ErrLeaseLost) || errors.Is(lateStep, backend.ErrNotOwner), "late step: %v", lateStep)
	assert.NoError(t, r.err, "the stale owner's work took effect: it is answered")
	assert.ErrorIs(t, un.Of("k"), backend.ErrNotOwner, "the stale owner's outcome is not recorded")
	rec, _, err := mem.Get(context.Background(), "k", clock.Now())
	require.NoError(t, err)
	assert.Equal(t, backend.StateCompleted, rec.State)
	assert.Equal(t, `"fresh"`, string(rec.Value))
	for _, st := range rec.Steps {
		assert.NotEqual(t, "late", st.Name)
	}
}

// A step that panics after an earlier step was recorded: the panic is a
// *PanicError, the key stays at its recovery point, and the next call
// resumes without running the recorded step.
func TestHostileStepPanicKeepsRecoveryPoint(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true})
	var aRuns, bRuns atomic.Int32
	panicNow := true
	fn := func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "a", func(context.Context) (int, error) { aRuns.Add(1); return 1, nil }); err != nil {
			return "", err
		}
		return idem.Step(ctx, "b", func(context.Context) (string, error) {
			bRuns.Add(1)
			if panicNow {
				panic("bank client bug")
			}
			return "ok", nil
		})
	}
	_, err := s.RunOnce(context.Background(), "k", "p", fn)
	var pe *idem.PanicError
	require.ErrorAs(t, err, &pe)
	rec, ok, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.True(t, ok, "kept at its recovery point")
	assert.Len(t, rec.Steps, 1)
	panicNow = false
	got, err := s.RunOnce(context.Background(), "k", "p", fn)
	require.NoError(t, err)
	assert.Equal(t, "ok", got)
	assert.Equal(t, int32(1), aRuns.Load())
	assert.Equal(t, int32(2), bRuns.Load())
}

// Begin/Ticket users: Step under Ticket.Context() records; a panic caught
// by the deferred Release keeps the recovery point; the next Begin resumes.
func TestHostileTicketStepsResume(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true})
	var aRuns atomic.Int32
	work := func(boom bool) (got string, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		tk, err := s.Begin(context.Background(), "k", "p")
		if err != nil {
			return "", err
		}
		defer tk.Release()
		if tk.Replayed() {
			v, err := tk.Result()
			return v, err
		}
		v, err := idem.Step(tk.Context(), "a", func(context.Context) (int, error) { aRuns.Add(1); return 3, nil })
		if err != nil {
			return tk.Finish("", err)
		}
		if boom {
			panic("consumer bug")
		}
		return tk.Finish(fmt.Sprint(v), nil)
	}
	_, err := work(true)
	require.Error(t, err)
	got, err := work(false)
	require.NoError(t, err)
	assert.Equal(t, "3", got)
	assert.Equal(t, int32(1), aRuns.Load(), "the step recorded before the panic did not run again")
}

// StepKey must differ from OperationKey for every step: a step named ""
// gets the operation's own key, so a service handed both (the whole
// operation's key for one call, the step's for another) would take the
// second call for a repeat of the first.
func TestHostileStepKeyEmptyNameCollidesWithOperationKey(t *testing.T) {
	s := hsStore[string](t, idem.Options{})
	var opKey, stepKey string
	var stepErr error
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		opKey = idem.OperationKey(ctx)
		_, stepErr = idem.Step(ctx, "", func(ctx context.Context) (int, error) {
			stepKey = idem.StepKey(ctx)
			return 0, nil
		})
		return "", nil
	})
	require.NoError(t, err)
	if stepErr == nil {
		assert.NotEqual(t, opKey, stepKey, "a step's derived key equals the operation's")
	}
}

// Many steps recorded concurrently from goroutines of one fn, with
// distinct names: all are recorded (no lost update in the record's read-
// modify-write), and none runs again on the resumed run.
func TestHostileStepsConcurrentDistinctNames(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true})
	const n = 32
	var runs [n]atomic.Int32
	fn := func(fail bool) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = idem.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { runs[i].Add(1); return i, nil })
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return "", err
			}
			if fail {
				return "", errors.New("transient")
			}
			return "done", nil
		}
	}
	_, err := s.RunOnce(context.Background(), "k", "p", fn(true))
	require.Error(t, err)
	rec, _, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.Len(t, rec.Steps, n)
	_, err = s.RunOnce(context.Background(), "k", "p", fn(false))
	require.NoError(t, err)
	for i := range n {
		assert.Equal(t, int32(1), runs[i].Load(), "step %d", i)
	}
}

// A replayed Ticket's Context belongs to no operation (Context's doc: "For
// a replayed ticket it is Begin's ctx"), whether the replay came from
// memory or from the Backend: Step must refuse rather than run a side
// effect for an operation that is over.
func TestHostileReplayedTicketHasNoOperation(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true})
	_, err := s.RunOnce(context.Background(), "k", "p", func(context.Context) (string, error) { return "done", nil })
	require.NoError(t, err)
	tk, err := s.Begin(context.Background(), "k", "p")
	require.NoError(t, err)
	replayed := tk.Replayed()
	require.True(t, replayed)
	ran := false
	_, err = idem.Step(tk.Context(), "x", func(context.Context) (int, error) { ran = true; return 0, nil })
	assert.ErrorIs(t, err, idem.ErrNoOperation)
	assert.False(t, ran, "a step ran for a replayed operation")
	assert.Equal(t, "", idem.OperationKey(tk.Context()))
}

// The same step name used for two different result types in one
// operation: the second call gets an error (the first's outcome does not
// decode into it), never a silently zero value.
func TestHostileStepSameNameOtherType(t *testing.T) {
	s := hsStore[string](t, idem.Options{Backend: idemtest.NewMemoryBackend(), Resume: true})
	var second error
	var got struct{ X []int }
	_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "x", func(context.Context) (string, error) { return "str", nil }); err != nil {
			return "", err
		}
		got, second = idem.Step(ctx, "x", func(context.Context) (struct{ X []int }, error) {
			return struct{ X []int }{[]int{1}}, nil
		})
		return "", nil
	})
	assert.ErrorContains(t, second, "was called with string before")
	assert.Nil(t, got.X)
}

// hsHangStepper is a MemoryBackend whose RecordStep hangs, as a backend
// that stopped answering does, until its ctx ends (or the test releases it).
type hsHangStepper struct {
	*idemtest.MemoryBackend
	release chan struct{}
}

func (h *hsHangStepper) RecordStep(ctx context.Context, key, token string, s backend.Step, now time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.release:
		return errors.New("released by the test")
	}
}

// A backend that stops answering while a step is recorded: Step records
// under context.WithoutCancel(ctx) with no bound at all, so neither
// ExecutionTimeout, nor the lease running out, nor SettleTimeout (which
// bounds every other write of an outcome) ends it. The execution hangs for
// ever, and Close with it (Close "bounds how long [it] waits for
// executions in flight, for an fn that honours its context": this fn
// does). Expected: Step gives up within those bounds with an error.
func TestHostileStepRecordOnHungBackendIsUnbounded(t *testing.T) {
	h := &hsHangStepper{MemoryBackend: idemtest.NewMemoryBackend(), release: make(chan struct{})}
	var once sync.Once
	unhang := func() { once.Do(func() { close(h.release) }) }
	defer unhang()
	s := idem.New[string](idem.Options{Backend: h, Resume: true,
		ExecutionTimeout: 200 * time.Millisecond, SettleTimeout: 200 * time.Millisecond, Lease: time.Second})
	stepDone := make(chan error, 1)
	go func() {
		_, _ = s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
			_, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil })
			stepDone <- err
			return "", err
		})
	}()
	select {
	case err := <-stepDone:
		assert.Error(t, err)
	case <-time.After(5 * time.Second):
		t.Error("Step still recording after 5s, past ExecutionTimeout, SettleTimeout and the lease")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Error("Close held up by a step recording on a backend that does not answer")
		unhang()
		<-closed
	}
}

// hsSlowResume is a MemoryBackend whose Resume replies late, as over a
// slow link: the resume lands at once, its reply after delay.
type hsSlowResume struct {
	*idemtest.MemoryBackend
	delay time.Duration
}

func (h *hsSlowResume) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	rec, err := h.MemoryBackend.Resume(ctx, key, old, token, now, lease)
	time.Sleep(h.delay) // the reply's latency, not an ordering of goroutines
	return rec, err
}

// A resume whose reply comes too late to trust its lease: beginDurable
// does what it does for a late claim, releaseOrLater, and Release deletes
// the record with every recovery point in it. The next call starts from
// scratch and runs the recorded step again. Expected: a late resume leaves
// the key at its recovery point (let the lease lapse), never drops steps.
func TestHostileLateResumeReplyDropsRecordedSteps(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	plain := hsStore[string](t, idem.Options{Backend: mem, Resume: true})
	hsAtRecoveryPoint(t, plain, "k", "p")

	slow := hsStore[string](t, idem.Options{Backend: &hsSlowResume{mem, 300 * time.Millisecond}, Resume: true, Lease: 200 * time.Millisecond})
	_, err := slow.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) { return "", nil })
	require.Error(t, err, "the late resume is not trusted")

	rec, ok, gerr := mem.Get(context.Background(), "k", time.Now())
	require.NoError(t, gerr)
	require.True(t, ok, "the key and its recovery points are gone")
	assert.Len(t, rec.Steps, 1)

	var reran atomic.Bool
	_, err = plain.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 1, nil })
		return "", err
	})
	require.NoError(t, err)
	assert.False(t, reran.Load(), "a recorded step ran again")
}

// hsLostResumeReply is a MemoryBackend whose Resume lands but whose reply
// is lost (the first time).
type hsLostResumeReply struct {
	*idemtest.MemoryBackend
	lost atomic.Bool
}

func (h *hsLostResumeReply) Resume(ctx context.Context, key, old, token string, now time.Time, lease time.Duration) (backend.Record, error) {
	rec, err := h.MemoryBackend.Resume(ctx, key, old, token, now, lease)
	if err == nil && h.lost.CompareAndSwap(false, true) {
		return backend.Record{}, errors.New("connection reset by peer")
	}
	return rec, err
}

// Rule 10: "A lost reply to a claim or an outcome write is resolved by
// reading the record back and comparing the token". A resume whose reply
// is lost is not read back: it stands under a token nobody holds, with a
// full lease (30s by default), and every retry meanwhile waits and gets
// ErrInProgress. Expected: the resume is settled by its token (run under
// it, or let it lapse at once), so a retry resumes without waiting a lease.
func TestHostileLostResumeReplyStrandsKeyForALease(t *testing.T) {
	mem := idemtest.NewMemoryBackend()
	lost := &hsLostResumeReply{MemoryBackend: mem}
	s := hsStore[string](t, idem.Options{Backend: lost, Resume: true})
	hsAtRecoveryPoint(t, s, "k", "p")

	fn := func(ctx context.Context) (string, error) {
		v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 2, nil })
		return fmt.Sprint(v), err
	}
	got, err := s.RunOnce(context.Background(), "k", "p", fn)
	if err != nil { // the lost reply was reported: a retry must then resume at once
		var be *idem.BackendError
		require.ErrorAs(t, err, &be)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got, err = s.RunOnce(ctx, "k", "p", fn)
	}
	require.NoError(t, err)
	assert.Equal(t, "1", got)
}

// README: "an interrupted key keeps [its steps] until it resumes, as it
// never expires on its own". A key at its recovery point, long past its
// TTL and swept, still resumes without rerunning its recorded step.
func TestHostileRecoveryPointOutlivesTTLAndSweep(t *testing.T) {
	for _, tc := range hsBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := hsStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now, TTL: time.Hour, SweepInterval: -1})
			hsAtRecoveryPoint(t, s, "k", "p")
			clock.Advance(48 * time.Hour)
			_, err := s.Sweep(context.Background())
			require.NoError(t, err)
			var reran atomic.Bool
			got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
				v, err := idem.Step(ctx, "a", func(context.Context) (int, error) { reran.Store(true); return 2, nil })
				return fmt.Sprint(v), err
			})
			require.NoError(t, err)
			assert.Equal(t, "1", got)
			assert.False(t, reran.Load())
		})
	}
}

// Step called with the operation's ctx after fn returned (a goroutine that
// kept it): the operation is completed, so the step must not run; Step
// says so before calling fn, and the record's steps are unchanged.
func TestHostileStepAfterOperationReturned(t *testing.T) {
	b := hsOpenBolt(t)
	s := hsStore[string](t, idem.Options{Backend: b, Resume: true})
	var kept context.Context
	_, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
		kept = ctx
		_, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
		return "done", err
	})
	require.NoError(t, err)
	var ran atomic.Bool
	_, err = idem.Step(kept, "late", func(context.Context) (int, error) { ran.Store(true); return 1, nil })
	assert.ErrorContains(t, err, "after its operation ended")
	assert.False(t, ran.Load(), "a step ran after its operation ended")
	rec, _, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "a", rec.Steps[0].Name)
}

// README: steps "go with [the record] when the outcome expires (TTL) or
// the key is forgotten": the next operation under the key runs its steps
// afresh, never replaying a step of the operation before.
func TestHostileStepsGoWithExpiryAndForget(t *testing.T) {
	for _, tc := range hsBackends {
		t.Run(tc.name, func(t *testing.T) {
			clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
			s := hsStore[string](t, idem.Options{Backend: tc.b(t), Resume: true, Now: clock.Now, TTL: time.Hour, SweepInterval: -1})
			run := func(v int) string {
				got, err := s.RunOnce(context.Background(), "k", "p", func(ctx context.Context) (string, error) {
					n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return v, nil })
					return fmt.Sprint(n), err
				})
				require.NoError(t, err)
				return got
			}
			assert.Equal(t, "1", run(1))
			clock.Advance(2 * time.Hour)
			assert.Equal(t, "2", run(2), "after expiry, the step runs afresh")

			hsAtRecoveryPoint(t, s, "k2", "p")
			clock.Advance(time.Second)
			require.NoError(t, s.Forget(context.Background(), "k2"))
			got, err := s.RunOnce(context.Background(), "k2", "p", func(ctx context.Context) (string, error) {
				n, err := idem.Step(ctx, "a", func(context.Context) (int, error) { return 3, nil })
				return fmt.Sprint(n), err
			})
			require.NoError(t, err)
			assert.Equal(t, "3", got, "after Forget, the step runs afresh")
		})
	}
}
