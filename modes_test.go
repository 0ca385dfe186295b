package idem_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errDeclined = errors.New("card declined")

// modeAnswers runs one sequence of calls on s and returns what each
// answered, written the way the README says the modes agree: the value,
// the error's message, and whether it is final.
func modeAnswers(t *testing.T, s *idem.Store[map[string]int], clock *idemtest.Clock) []string {
	ctx := context.Background()
	var out []string
	note := func(v map[string]int, err error) {
		msg := "<nil>"
		if err != nil {
			msg = err.Error()
		}
		out = append(out, fmt.Sprintf("%v %q final=%v", v, msg, idem.IsFinal(err)))
	}
	ok := func(n int) func(context.Context) (map[string]int, error) {
		return func(context.Context) (map[string]int, error) { return map[string]int{"n": n}, nil }
	}
	declined := func(context.Context) (map[string]int, error) { return nil, idem.Final(errDeclined) }
	transient := func(context.Context) (map[string]int, error) { return nil, errors.New("timeout") }

	note(s.RunOnce(ctx, "a", "p", ok(1)))     // runs
	note(s.RunOnce(ctx, "a", "p", ok(2)))     // replays 1
	note(s.RunOnce(ctx, "a", "q", ok(3)))     // mismatch
	note(s.RunOnce(ctx, "b", "p", declined))  // a final error
	note(s.RunOnce(ctx, "b", "p", ok(4)))     // replays it
	note(s.RunOnce(ctx, "c", "p", transient)) // released
	note(s.RunOnce(ctx, "c", "p", ok(5)))     // runs again
	require.NoError(t, s.Forget(ctx, "a"))    //
	note(s.RunOnce(ctx, "a", "p", ok(6)))     // runs again
	clock.Advance(2 * time.Hour)              // past the TTL
	note(s.RunOnce(ctx, "b", "p", ok(7)))     // expired: runs
	tk, err := s.Begin(ctx, "c", "p")         // expired too: owned
	require.NoError(t, err)
	out = append(out, fmt.Sprint("replayed=", tk.Replayed()))
	note(tk.Finish(map[string]int{"n": 8}, nil))
	tk, err = s.Begin(ctx, "c", "p")
	require.NoError(t, err)
	out = append(out, fmt.Sprint("replayed=", tk.Replayed()))
	note(tk.Result())
	return out
}

// The same sequence answers alike without a Backend and on bolt, but for
// the one difference the README states: with a Backend a replayed final
// error keeps its message, not its identity (errors.Is no longer finds
// errDeclined; IsFinal holds in both), and a replayed value is a copy.
func TestModesAnswerAlike(t *testing.T) {
	clock := func() *idemtest.Clock { return idemtest.NewClock(time.Now().UTC().Truncate(time.Second)) }
	mc := clock()
	memory := idem.New[map[string]int](idem.Options{TTL: time.Hour, Now: mc.Now, SweepInterval: -1})
	defer memory.Close()
	b, err := bolt.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	require.NoError(t, err)
	defer b.Close()
	bc := clock()
	durable := idem.New[map[string]int](idem.Options{TTL: time.Hour, Now: bc.Now, SweepInterval: -1, Backend: b})
	defer durable.Close()

	got, want := modeAnswers(t, durable, bc), modeAnswers(t, memory, mc)
	assert.Equal(t, want, got)
	assert.True(t, strings.Contains(want[3], "card declined") && strings.HasSuffix(want[4], "final=true"))

	// The stated difference, both halves.
	ctx := context.Background()
	fn := func(context.Context) (map[string]int, error) { return nil, idem.Final(errDeclined) }
	_, _ = memory.RunOnce(ctx, "d", "p", fn)
	_, err = memory.RunOnce(ctx, "d", "p", fn)
	assert.ErrorIs(t, err, errDeclined, "memory replays the error fn returned")
	_, _ = durable.RunOnce(ctx, "d", "p", fn)
	_, err = durable.RunOnce(ctx, "d", "p", fn)
	assert.NotErrorIs(t, err, errDeclined, "a Backend replays the message")
	assert.True(t, idem.IsFinal(err))
	for name, s := range map[string]*idem.Store[map[string]int]{"memory": memory, "durable": durable} {
		first, err := s.RunOnce(ctx, "e", "p", func(context.Context) (map[string]int, error) { return map[string]int{"n": 1}, nil })
		require.NoError(t, err)
		first["n"] = 99 // a caller that mutates its answer
		again, err := s.RunOnce(ctx, "e", "p", nil2)
		require.NoError(t, err)
		if name == "memory" {
			assert.Equal(t, 99, again["n"], "memory shares the one value fn returned")
		} else {
			assert.Equal(t, 1, again["n"], "a Backend decodes a copy for each replay")
		}
	}
}

func nil2(context.Context) (map[string]int, error) { return nil, errors.New("must not run") }
