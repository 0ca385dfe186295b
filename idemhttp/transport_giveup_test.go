package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lostReplies is a Base whose every attempt loses its reply, as a server
// that dies mid-deploy does; it keeps the key each attempt carried.
type lostReplies struct {
	mu   sync.Mutex
	keys []string
	err  error
}

func (b *lostReplies) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.keys = append(b.keys, r.Header.Get(idemhttp.Header))
	return nil, b.err
}

// The error of a request whose every attempt failed says what the
// Transport did: how many attempts, over how long, with which key. It
// wraps the last attempt's error, inside http.Client's *url.Error.
func TestTransportGiveUpSaysWhatItDid(t *testing.T) {
	base := &lostReplies{err: io.ErrUnexpectedEOF}
	client := &http.Client{Transport: &idemhttp.Transport{Base: base, MaxAttempts: 3, MinBackoff: time.Millisecond}}
	_, err := client.Post("http://example.invalid/charges", "application/json", strings.NewReader("{}"))
	require.Error(t, err)

	var re *idemhttp.RetryError
	require.ErrorAs(t, err, &re, err.Error())
	assert.Equal(t, 3, re.Attempts)
	require.Len(t, base.keys, 3)
	assert.Equal(t, base.keys[0], re.Key)
	assert.Equal(t, base.keys[0], base.keys[2])
	assert.Positive(t, re.Elapsed)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Contains(t, err.Error(), "3 attempts in ")
	assert.Contains(t, err.Error(), re.Key)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	assert.False(t, ue.Timeout())
}

// A timeout stays a timeout through the RetryError: url.Error's Timeout
// and context.DeadlineExceeded both see it.
func TestTransportGiveUpKeepsTheTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	base := &lostReplies{err: context.DeadlineExceeded}
	client := &http.Client{Transport: &idemhttp.Transport{Base: base, MinBackoff: time.Millisecond}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.invalid/charges", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = client.Transport.RoundTrip(req)
	var re *idemhttp.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Attempts) // the context had ended: no retry
	assert.True(t, re.Timeout())
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
}
