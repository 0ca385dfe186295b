package idemhttp

import (
	"bufio"
	"net"
	"net/http"
)

// A Response is what the middleware remembers for a key and replays: the
// status, the allowed headers and the body.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// write sends r to w, marked as a replay.
func (r *Response) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// neverStored are headers that are never remembered, even if allowlisted:
// credentials, and hop-by-hop headers that describe one connection.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Proxy-Authorization": true, "Proxy-Authenticate": true,
	"Www-Authenticate": true, "Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, ReplayedHeader: true,
}

// recorder passes a handler's response through to the client as it is
// written, and keeps a copy to remember: the status, the allowed headers as
// they stood when the response was sent, and the body up to maxBody.
type recorder struct {
	w       http.ResponseWriter
	allowed map[string]bool // canonical header names to keep
	maxBody int

	resp      Response
	oversized bool // the body passed maxBody: delivered, not remembered
	streamed  bool // the handler flushed or hijacked: delivered, not remembered
}

func newRecorder(w http.ResponseWriter, allowed map[string]bool, maxBody int) *recorder {
	return &recorder{w: w, allowed: allowed, maxBody: maxBody}
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if r.resp.Status != 0 {
		return // net/http ignores it too, with a log line
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		r.w.WriteHeader(code) // informational: passed on, not the response
		return
	}
	r.resp.Status = code
	r.keepHeaders()
	r.w.WriteHeader(code)
}

// keepHeaders copies the allowed headers as they stand when the response is
// sent.
func (r *recorder) keepHeaders() {
	for name, v := range r.w.Header() {
		if r.allowed[name] && !neverStored[name] {
			if r.resp.Header == nil {
				r.resp.Header = make(http.Header)
			}
			r.resp.Header[name] = append([]string(nil), v...)
		}
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.resp.Status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.oversized {
		if len(r.resp.Body)+len(p) > r.maxBody {
			r.oversized, r.resp.Body = true, nil
		} else {
			r.resp.Body = append(r.resp.Body, p...)
		}
	}
	return r.w.Write(p)
}

// Flush sends what was written so far: the response is streamed, so it is
// not remembered.
func (r *recorder) Flush() {
	r.streamed = true
	_ = http.NewResponseController(r.w).Flush()
}

// Hijack hands the connection to the handler: the response is not
// remembered.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	r.streamed = true
	return http.NewResponseController(r.w).Hijack()
}

// Unwrap lets http.ResponseController reach the client's ResponseWriter for
// what the recorder does not handle itself.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// complete reports whether the recorder holds the whole response: it was
// neither streamed nor larger than maxBody.
func (r *recorder) complete() bool { return !r.oversized && !r.streamed }

// response returns what the handler sent, and whether it may be remembered:
// 2xx, 3xx and 4xx but 408, 409, 425 and 429, complete.
func (r *recorder) response() (Response, bool) {
	if r.resp.Status == 0 && !r.streamed {
		r.resp.Status = http.StatusOK // the handler wrote nothing: net/http sends 200
		r.keepHeaders()
	}
	resp := r.resp
	switch resp.Status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return resp, false
	}
	return resp, resp.Status >= 200 && resp.Status < 500 && r.complete()
}
