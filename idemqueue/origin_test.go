package idemqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// The store's refusals (another payload under the id, an invalid key, a
// payload it cannot fingerprint) are judged by where they came from: an
// error a handler returns is a failure of that handler, which the store
// did not record, whatever it wraps.

// downstream is what a handler returns when an idempotent call it made
// downstream was refused: not final, so the store released the key.
var downstream = map[string]error{
	"mismatch":        fmt.Errorf("charging the card: %w", idem.ErrPayloadMismatch),
	"bare mismatch":   idem.ErrPayloadMismatch,
	"invalid key":     fmt.Errorf("calling the ledger: %w", idem.ErrInvalidKey),
	"invalid payload": fmt.Errorf("calling the ledger: %w", idem.ErrInvalidPayload),
}

func TestHandlerErrorThatWrapsAStoreRefusalIsRetried(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{RetryDelay: 3 * time.Second})
	ctx := context.Background()
	for name, err := range downstream {
		var runs atomic.Int32
		d := c.Handle(ctx, "m-"+name, "body", func(context.Context) (int, error) { runs.Add(1); return 0, err })
		assert.Equal(t, Retry, d.Action, "%s: nothing was recorded", name)
		assert.Equal(t, 3*time.Second, d.Delay, name)
		assert.ErrorIs(t, d.Err, err, name)
		assert.Equal(t, err.Error(), d.Err.Error(), name)
		// The key was released: the redelivery runs.
		d = c.Handle(ctx, "m-"+name, "body", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
		assert.Equal(t, Decision{Action: Ack}, d, name)
		assert.Equal(t, int32(2), runs.Load(), name)
	}
	// Marked Final, the same error is the handler's definitive outcome.
	d := c.Handle(ctx, "m-final", "body", func(context.Context) (int, error) {
		return 0, idem.Final(downstream["mismatch"])
	})
	assert.Equal(t, Reject, d.Action)
}

// A delivery that waits for another delivery of its id in this process
// gets that delivery's failure from Begin, before its own handler runs:
// it is still a handler's failure, not the store's refusal.
func TestDeliveryThatWaitedForAFailedHandlerIsRetried(t *testing.T) {
	claiming := make(chan struct{})
	s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend(), Fingerprint: func(p any) (idem.Fingerprint, error) {
		if p == "second" {
			close(claiming) // Begin fingerprints the payload just before it claims
		}
		return idem.DefaultFingerprint("body") // one payload, as two deliveries carry
	}})
	t.Cleanup(func() { s.Close() })
	c, err := New(s, Options{})
	require.NoError(t, err)
	ctx := context.Background()
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan Decision, 1)
	go func() {
		first <- c.Handle(ctx, "m1", "first", func(context.Context) (int, error) {
			close(started)
			<-release
			return 0, downstream["bare mismatch"]
		})
	}()
	<-started // the first holds the key
	second := make(chan Decision, 1)
	var ran atomic.Bool
	go func() {
		second <- c.Handle(ctx, "m1", "second", func(context.Context) (int, error) {
			ran.Store(true) // the first released the key before this one claimed it
			return 0, downstream["bare mismatch"]
		})
	}()
	<-claiming
	close(release)
	for _, d := range []Decision{<-first, <-second} {
		assert.Equal(t, Retry, d.Action, "a handler's failure")
		assert.Equal(t, idem.ErrPayloadMismatch, d.Err, "the handler's error, as it returned it")
	}
	t.Logf("the second delivery ran its own handler: %v", ran.Load())
}

// HandleTx (a RunOnceTx, here a RunOnce, in the call) cannot see which
// phase the call's error came from: it judges a refusal by the store's
// state, so the handler's error is retried and the store's refusal is not.
func TestHandleTxJudgesARefusalByTheStore(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	call := func(fn func(context.Context) (int, error)) func(context.Context, string, any) error {
		return func(ctx context.Context, key string, payload any) error {
			_, err := c.Store().RunOnce(ctx, key, payload, fn)
			return err
		}
	}
	for name, err := range downstream {
		d := c.HandleTx(ctx, "m-"+name, "body", call(func(context.Context) (int, error) { return 0, err }))
		assert.Equal(t, Retry, d.Action, "%s: the handler's failure", name)
		assert.ErrorIs(t, d.Err, err, name)
	}
	ok := call(func(context.Context) (int, error) { return 1, nil })
	require.Equal(t, Ack, c.HandleTx(ctx, "m1", "body", ok).Action)
	d := c.HandleTx(ctx, "m1", "another body", ok)
	assert.Equal(t, Reject, d.Action, "another payload under the id: the store's refusal")
	assert.ErrorIs(t, d.Err, idem.ErrPayloadMismatch)
	d = c.HandleTx(ctx, "m2", math.NaN(), ok)
	assert.Equal(t, Reject, d.Action, "a payload the store cannot fingerprint")
	assert.ErrorIs(t, d.Err, idem.ErrInvalidPayload)
	d = c.HandleTx(ctx, "", "body", ok)
	assert.Equal(t, Hold, d.Action, "no id")

	// A Fingerprint that panics: the store calls it an invalid payload,
	// under Handle and HandleTx alike.
	s := idem.New[int](idem.Options{Backend: idemtest.NewMemoryBackend(), Fingerprint: func(any) (idem.Fingerprint, error) { panic("bug") }})
	t.Cleanup(func() { s.Close() })
	pc, err := New(s, Options{})
	require.NoError(t, err)
	assert.Equal(t, Reject, pc.Handle(ctx, "m1", "body", func(context.Context) (int, error) { return 1, nil }).Action)
	d = pc.HandleTx(ctx, "m1", "body", func(ctx context.Context, key string, payload any) error {
		_, err := s.RunOnce(ctx, key, payload, func(context.Context) (int, error) { return 1, nil })
		return err
	})
	assert.Equal(t, Reject, d.Action)
	assert.ErrorIs(t, d.Err, idem.ErrInvalidPayload)

	// Without the payload, Decide cannot tell: it retries.
	assert.Equal(t, Retry, c.Decide(ctx, "m1", idem.ErrPayloadMismatch).Action)
	assert.Equal(t, Retry, c.Decide(ctx, "m1", downstream["invalid key"]).Action, "a valid key")
}

// The same over a transaction of bolt's, whose record HandleTx reads
// back: a refusal of another payload is the store's, found in the
// record; the handler's own error, though the same sentinel, is retried
// and its writes rolled back.
func TestHandleTxOverBoltJudgesARefusalByTheRecord(t *testing.T) {
	b, err := bolt.Open(t.TempDir()+"/idem.db", nil)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	c := consumer(t, b, Options{})
	ctx := context.Background()
	call := func(fail error) func(context.Context, string, any) error {
		return func(ctx context.Context, key string, payload any) error {
			_, err := bolt.RunOnceTx(ctx, c.Store(), key, payload, func(context.Context, *bbolt.Tx) (int, error) { return 1, fail })
			return err
		}
	}
	require.Equal(t, Ack, c.HandleTx(ctx, "m1", []byte("body"), call(nil)).Action)
	d := c.HandleTx(ctx, "m1", []byte("another body"), call(nil))
	assert.Equal(t, Reject, d.Action, "another payload under the id")
	assert.ErrorIs(t, d.Err, idem.ErrPayloadMismatch)
	d = c.HandleTx(ctx, "m2", []byte("body"), call(idem.ErrPayloadMismatch))
	assert.Equal(t, Retry, d.Action, "the handler's own error")
	assert.Equal(t, Ack, c.HandleTx(ctx, "m2", []byte("body"), call(nil)).Action, "the key was left free")
}

// A handler that panics with an error marked Final (panic(idem.Final(err)))
// failed before commit: the core releases the key and records nothing, so
// the message must be retried, not rejected (dead-lettered) as if its
// failure were the recorded, definitive outcome. Decide must agree with
// the store about what a panic is.
func TestPanicWithAFinalErrorIsRetried(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	ctx := context.Background()
	declined := idem.Final(errors.New("card declined"))
	var runs atomic.Int32
	d := c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { runs.Add(1); panic(declined) })
	var panicked *idem.PanicError
	require.ErrorAs(t, d.Err, &panicked)
	assert.Equal(t, Retry, d.Action, "a panic released the key: nothing was recorded")
	assert.False(t, d.Replayed)

	// The store agrees: the key was released, and the next delivery runs.
	d = c.Handle(ctx, "m1", "body", func(context.Context) (int, error) { runs.Add(1); return 1, nil })
	assert.Equal(t, Decision{Action: Ack}, d)
	assert.Equal(t, int32(2), runs.Load())

	// Decide alone, with the error a handler's panic becomes.
	d = c.Decide(ctx, "m2", &idem.PanicError{Value: declined})
	assert.Equal(t, Retry, d.Action)
}

// A payload the store cannot fingerprint (a NaN float, a channel, a
// MarshalJSON that fails) fails the same way on every delivery: the
// handler never runs, and the message is rejected rather than retried
// for ever.
func TestUnfingerprintablePayloadIsRejected(t *testing.T) {
	c := consumer(t, idemtest.NewMemoryBackend(), Options{})
	var runs atomic.Int32
	fn := func(context.Context) (int, error) { runs.Add(1); return 1, nil }
	for i := 0; i < 3; i++ { // three redeliveries of the same message
		d := c.Handle(context.Background(), "m1", map[string]any{"amount": math.NaN()}, fn)
		assert.Equal(t, Reject, d.Action, "delivery %d", i)
		assert.ErrorIs(t, d.Err, idem.ErrInvalidPayload)
	}
	assert.Zero(t, runs.Load())
}

// An idem.ErrOutcomeUnknown under HandleTx goes to Reconcile only when
// the store bears it out (the key's record is claimed, not completed): a
// handler's own error that wraps it (a call it made downstream was
// interrupted) failed, and its transaction rolled back, so the message
// is retried after RetryDelay, and Reconcile, which may settle the key
// by the effect's target, is never told this key was interrupted.
func TestHandleTxJudgesAnInterruptionByTheStore(t *testing.T) {
	b := idemtest.NewMemoryBackend()
	interrupted(t, b, "m1")
	var reconciled []string
	c := consumer(t, b, Options{RetryDelay: 3 * time.Second, Reconcile: func(ctx context.Context, key string, err error) Decision {
		reconciled = append(reconciled, key)
		return Decision{Action: Retry, Delay: time.Hour, Err: err}
	}})
	ctx := context.Background()
	call := func(fn func(context.Context) (int, error)) func(context.Context, string, any) error {
		return func(ctx context.Context, key string, payload any) error {
			_, err := c.Store().RunOnce(ctx, key, payload, fn)
			return err
		}
	}
	down := fmt.Errorf("calling the ledger: %w", idem.ErrOutcomeUnknown)
	d := c.HandleTx(ctx, "m2", "body", call(func(context.Context) (int, error) { return 0, down }))
	assert.Equal(t, Retry, d.Action)
	assert.Equal(t, 3*time.Second, d.Delay, "the handler's failure")
	assert.ErrorIs(t, d.Err, down)
	assert.Empty(t, reconciled, "Reconcile told of a key that is free")
	assert.Equal(t, Ack, c.HandleTx(ctx, "m2", "body", call(func(context.Context) (int, error) { return 1, nil })).Action)

	d = c.HandleTx(ctx, "m1", "body", call(func(context.Context) (int, error) { t.Error("ran"); return 0, nil }))
	assert.Equal(t, Decision{Action: Retry, Delay: time.Hour, Err: d.Err}, d, "the store's: Reconcile decides")
	assert.ErrorIs(t, d.Err, idem.ErrOutcomeUnknown)
	assert.Equal(t, []string{"m1"}, reconciled)
}
