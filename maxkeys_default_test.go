package idem_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/require"
)

// The zero Options bound the keys held in memory at 100,000: the next new
// key is ErrFull while known keys still replay. A negative MaxKeys opts out.
func TestZeroOptionsBoundTheKeys(t *testing.T) {
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }
	const bound = 100_000
	for _, tc := range []struct {
		maxKeys int
		full    bool
	}{{0, true}, {-1, false}} {
		s := idem.New[int](idem.Options{MaxKeys: tc.maxKeys})
		for i := range bound {
			_, err := s.RunOnce(ctx, "k"+strconv.Itoa(i), nil, ok)
			require.NoError(t, err)
		}
		_, err := s.RunOnce(ctx, "one-more", nil, ok)
		if tc.full {
			require.True(t, errors.Is(err, idem.ErrFull), "MaxKeys %d: %v", tc.maxKeys, err)
			v, err := s.RunOnce(ctx, "k7", nil, func(context.Context) (int, error) { return 2, nil })
			require.NoError(t, err)
			require.Equal(t, 1, v, "a known key still replays")
		} else {
			require.NoError(t, err, "MaxKeys %d", tc.maxKeys)
		}
		require.NoError(t, s.Close())
	}
}
