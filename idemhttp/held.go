package idemhttp

import (
	"errors"
	"maps"
	"net/http"
)

// The transactional mode's side of the recorder: the handler's response is
// held, whole, until its transaction commits, and only then sent. What
// cannot be held is refused at once: the handler is told (its Flush,
// Hijack or Write fails), and its writes roll back with the key.

var (
	errStreamedInTx = errors.New("idemhttp: the handler flushed its response, but in the transactional mode (Options.InTx) nothing is sent before its transaction commits; the request is refused and its writes rolled back")
	errHijackedInTx = errors.New("idemhttp: the handler took the connection over (Hijack), which the transactional mode (Options.InTx) cannot hold until its transaction commits; the request is refused and its writes rolled back")
	errTooLargeInTx = errors.New("idemhttp: the handler's response is larger than Options.MaxStoredBody, which the transactional mode (Options.InTx) must hold whole until its transaction commits; the request is refused and its writes rolled back")
)

// refusedInTx reports whether err is the refusal of a response that could
// not be held.
func refusedInTx(err error) bool {
	return errors.Is(err, errStreamedInTx) || errors.Is(err, errHijackedInTx) || errors.Is(err, errTooLargeInTx)
}

// hold keeps p to send once the transaction commits; it fails as net/http's
// Write would, or because the response cannot be held.
func (r *recorder) hold(p []byte) (int, error) {
	switch {
	case r.refused != nil:
		return 0, r.refused
	case !bodyAllowed(r.resp.Status):
		return 0, http.ErrBodyNotAllowed
	case r.declared >= 0 && r.written+int64(len(p)) > r.declared:
		return 0, http.ErrContentLength
	case len(r.resp.Body)+len(p) > r.maxBody:
		r.oversized, r.resp.Body = true, nil
		r.refuse(errTooLargeInTx)
		return 0, errTooLargeInTx
	}
	r.resp.Body = append(r.resp.Body, p...)
	r.written += int64(len(p))
	return len(p), nil
}

// refuse notes the first reason the response cannot be held.
func (r *recorder) refuse(err error) {
	if r.refused == nil {
		r.refused = err
	}
}

// send writes a held response to the client once its transaction has
// committed, or once it has rolled back and the response is one not
// remembered (a 5xx), as net/http would have sent it unheld: its status,
// every header the handler set (not only those remembered: a cookie goes
// to the first client, never to a replay) as they stood when it called
// WriteHeader, its body, and the trailers, from the headers as the
// handler left them. A client gone by then is the lost reply a retry
// replays.
func (r *recorder) send(status int) {
	h := r.w.Header()
	var final http.Header
	if r.header != nil {
		// A header set after WriteHeader is not sent, and a declared
		// trailer's value set after it is a trailer only, as net/http
		// would have it had WriteHeader reached it.
		final = h.Clone()
		clear(h)
		maps.Copy(h, r.header)
	}
	r.w.WriteHeader(status)
	if len(r.resp.Body) > 0 {
		_, _ = r.w.Write(r.resp.Body)
	}
	if final != nil { // net/http reads the trailers' values from it once the handler returns
		clear(h)
		maps.Copy(h, final)
	}
}

// bodyAllowed reports whether a response with status may have a body, as
// net/http judges it.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
