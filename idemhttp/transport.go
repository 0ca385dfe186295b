package idemhttp

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Transport is an http.RoundTripper that makes requests safe to retry. For
// each POST or PATCH (by default) it uses the request's own Idempotency-Key,
// or makes one, and sends that same key on every attempt. It retries only
// outcomes that leave the result unknown or say "try again": a connection
// error or timeout, and 408, 409, 425, 429, 502, 503 and 504. It never
// retries 400, 422 or any other answer. Between attempts it waits a capped,
// jittered exponential backoff, never less than a Retry-After header asks,
// and gives up, returning the last answer, when the wait would pass MaxWait
// or outlast the request's context, or after MaxAttempts. By default it
// makes 5 attempts over 3.75 to 7.5 seconds (waits from 0.5 s, doubling,
// capped at 5 s): long enough to outlive a rolling deploy's restart or a
// database failover, and in line with its peers: Stripe's SDKs wait from
// 0.5 s, doubling up to 5 s; the AWS SDKs' standard retryer makes 3
// attempts, its waits drawn up to 1 s and then 2 s, capped at 20 s. A
// caller that must answer sooner bounds the request with its context. If
// the last attempt ends in an error (no answer), the error is a
// *RetryError: how many attempts, over how long, and the key they sent,
// wrapping that last error. While it waits it reads what is left
// of the answer it retries, a few KiB, for 100ms or the wait at most, so
// that the connection can carry the retry; a longer or slower body is
// closed unread, and never holds the retry back.
//
// A redirect that http.Client follows with the same method (307, 308) is
// sent with the key of the request it redirects, so the operation keeps one
// key wherever it is answered, another host included, as http.Client
// forwards a key the caller set; a 303's GET is another request.
//
// The body is rewound with Request.GetBody (set by http.NewRequest for
// common body types); a request whose body cannot be rewound is sent once.
// A key made by Transport lives only as long as the call: for retries that
// must survive a restart, make the key with the order (NewKey), store it,
// and attach it with WithKey.
//
// A Transport is safe for concurrent use. Its fields must not change once it
// is in use.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper

	// Methods are the request methods that get a key and retries; others
	// are sent once, as they are. Nil means POST and PATCH.
	Methods []string

	// MaxAttempts bounds the attempts per request, the first included. Zero
	// means 5.
	MaxAttempts int

	// MinBackoff is the base wait before the first retry; each retry
	// doubles it, up to MaxBackoff, and a random part of up to half is taken
	// off. Zero means 500ms.
	MinBackoff time.Duration

	// MaxBackoff caps the backoff (not a Retry-After). Zero means 5s.
	MaxBackoff time.Duration

	// MaxWait bounds any one wait before a retry, a Retry-After's included:
	// an answer whose Retry-After asks for longer is returned to the caller
	// instead of retried sooner than the server asked. Zero means one
	// minute.
	MaxWait time.Duration
}

var _ http.RoundTripper = (*Transport)(nil)

// A RetryError is the error of a request the Transport guards whose last
// attempt got no answer (a connection error, a timeout, the context
// ended): what the Transport did before it gave up. It wraps that last
// error, so errors.Is and errors.As see through it; http.Client returns it
// inside a *url.Error.
type RetryError struct {
	Attempts int           // the attempts sent, the first included
	Elapsed  time.Duration // from the first attempt to giving up
	Key      string        // the Idempotency-Key field every attempt carried
	Err      error         // the last attempt's error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("idemhttp: %d %s in %v with Idempotency-Key %s: %v",
		e.Attempts, plural(e.Attempts, "attempt", "attempts"), e.Elapsed.Round(time.Millisecond), e.Key, e.Err)
}

func (e *RetryError) Unwrap() error { return e.Err }

// Timeout reports whether the last error was a timeout, as url.Error's
// Timeout asks of the error it wraps.
func (e *RetryError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// RoundTrip sends req, retrying as Transport describes. It does not change
// req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !t.guards(req.Method) {
		return base.RoundTrip(req)
	}
	key := keyOf(req.Header)
	if key == "" && req.Response != nil && req.Response.Request != nil && req.Response.Request.Method == req.Method {
		// http.Client follows a redirect with the caller's headers, not
		// those of the attempt redirected: keep that attempt's key.
		key = keyOf(req.Response.Request.Header)
	}
	if key == "" {
		key = NewKey()
	} else if !strings.HasPrefix(key, `"`) {
		key = encodeKey(key) // a bare key with a comma would read as a list
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	maxAttempts := t.maxAttempts()
	start := time.Now()
	// gaveUp is what RoundTrip returns once it stops: an error says
	// what the Transport did before it.
	gaveUp := func(attempts int, resp *http.Response, err error) (*http.Response, error) {
		if err != nil {
			err = &RetryError{Attempts: attempts, Elapsed: time.Since(start), Key: key, Err: err}
		}
		return resp, err
	}
	for attempt := 1; ; attempt++ {
		r := req.Clone(req.Context())
		setKey(r.Header, key)
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return gaveUp(attempt-1, nil, err)
			}
			r.Body = body
		} else if attempt > 1 {
			r.Body = http.NoBody // the request had none
		}
		resp, err := base.RoundTrip(r)
		if !retryable(resp, err) || attempt == maxAttempts || !rewindable || req.Context().Err() != nil {
			return gaveUp(attempt, resp, err)
		}
		wait := t.backoff(attempt, resp)
		if wait > t.maxWait() {
			return gaveUp(attempt, resp, err) // the server asks for a longer wait than the caller allows
		}
		if deadline, ok := req.Context().Deadline(); ok && time.Until(deadline) < wait {
			return gaveUp(attempt, resp, err) // the context would end first: give the caller this answer
		}
		var drained <-chan struct{}
		if resp != nil && resp.Body != nil { // a Base that breaks the contract may leave it nil
			drained = discard(resp.Body, min(drainTime, wait)) // never past the wait: it must not hold the retry back
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-req.Context().Done():
			timer.Stop()
			return gaveUp(attempt, nil, req.Context().Err())
		}
		if drained != nil {
			select { // closed by now, or at once: bounded by the wait
			case <-drained:
			case <-req.Context().Done():
				return gaveUp(attempt, nil, req.Context().Err())
			}
		}
	}
}

// The body of an answer the Transport retries is read, while it waits,
// so that its connection can carry the retry, up to drainBytes and for
// drainTime or the wait at most; past either, it is closed unread, and
// the connection is not reused. A body that stalls thus never holds a
// retry back.
const (
	drainBytes = 4 << 10
	drainTime  = 100 * time.Millisecond
)

// discard reads what is left of body, up to drainBytes, and closes it,
// or closes it unread once bound has passed, and returns a channel closed
// when it is done, at bound at the latest: the caller never waits on the
// body longer, whatever its Read or Close does (an HTTP/2 body's Close
// may wait on the connection's writes).
func discard(body io.ReadCloser, bound time.Duration) <-chan struct{} {
	var once sync.Once
	closeBody := func() { once.Do(func() { body.Close() }) }
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, io.LimitReader(body, drainBytes))
		closeBody()
	}()
	done := make(chan struct{})
	go func() {
		timer := time.NewTimer(bound)
		defer timer.Stop()
		select {
		case <-closed:
			close(done)
		case <-timer.C:
			close(done)
			closeBody() // ends a blocked Read (net/http's bodies allow it), and the connection with it
		}
	}()
	return done
}

func (t *Transport) guards(method string) bool {
	if t.Methods == nil {
		return method == http.MethodPost || method == http.MethodPatch
	}
	for _, m := range t.Methods {
		if m == method {
			return true
		}
	}
	return false
}

// retryable reports whether an attempt's outcome leaves the result unknown or
// asks to try again.
func retryable(resp *http.Response, err error) bool {
	if err != nil {
		return true // the request may or may not have reached the server
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// backoff is the wait after the given attempt: exponential from MinBackoff,
// capped at MaxBackoff, less a random part of up to half, and never less
// than a Retry-After on resp.
func (t *Transport) backoff(attempt int, resp *http.Response) time.Duration {
	lo, hi := t.MinBackoff, t.MaxBackoff
	if lo <= 0 {
		lo = 500 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	d := lo << min(attempt-1, 30)
	if d > hi || d <= 0 {
		d = hi
	}
	d -= time.Duration(rand.Int64N(int64(d)/2 + 1))
	if resp != nil {
		d = max(d, retryAfter(resp.Header.Get("Retry-After")))
	}
	return d
}

func (t *Transport) maxAttempts() int {
	if t.MaxAttempts <= 0 {
		return 5
	}
	return t.MaxAttempts
}

func (t *Transport) maxWait() time.Duration {
	if t.MaxWait <= 0 {
		return time.Minute
	}
	return t.MaxWait
}

// retryAfter reads a Retry-After value: seconds, or an HTTP date. A wait
// too long for a time.Duration is the longest one.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 64); err == nil {
		if s > uint64(math.MaxInt64/time.Second) {
			return math.MaxInt64
		}
		return time.Duration(s) * time.Second
	} else if errors.Is(err, strconv.ErrRange) {
		return math.MaxInt64
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(at))
	}
	return 0
}
