package waitctx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
)

// A call cut short by its bound's own end is a wait that ran out: its
// error matches ErrInProgress and still says why. Any other answer is
// left as it is.
func TestACallCutShortByItsBoundRanOut(t *testing.T) {
	ended := WithTimeout(context.Background(), time.Nanosecond)
	defer ended.Stop()
	<-ended.Done()
	live := WithTimeout(context.Background(), time.Hour)
	defer live.Stop()
	other := errors.New("unreachable")
	inProgress := errors.Join(backend.ErrInProgress, context.DeadlineExceeded)

	if err := RanOut(ended, context.DeadlineExceeded); !errors.Is(err, backend.ErrInProgress) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cut short by its bound: %v, want ErrInProgress and the bound's end", err)
	}
	for _, c := range []struct {
		name  string
		bound context.Context
		err   error
	}{
		{"no error", ended, nil},
		{"another failure", ended, other},
		{"a wait that ran out already", ended, inProgress},
		{"a bound that has not ended", live, context.DeadlineExceeded},
	} {
		if got := RanOut(c.bound, c.err); got != c.err {
			t.Errorf("%s: %v, want %v as it was", c.name, got, c.err)
		}
	}
}
