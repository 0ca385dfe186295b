package idemhttp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// A Response is what the middleware remembers for a key and replays: the
// status, the stored headers and the body.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`

	// Trailer holds the trailers the handler sent after the body (declared
	// in a Trailer header, or set with http.TrailerPrefix), judged by the
	// same rules as headers. A replay declares and sends them again.
	Trailer http.Header `json:"trailer,omitempty"`

	// Omitted says why the body was not kept, for a response whose status
	// is remembered but whose body could not be: "streamed" (the handler
	// flushed), "too-large" (past Options.MaxStoredBody), "truncated"
	// (not the Content-Length it was sent with) or "hijacked" (the handler
	// took the connection over and answered on it).
	// Empty when Body is the whole body.
	Omitted string `json:"omitted,omitempty"`
}

// BodyOmittedHeader marks a replay whose original body was not kept: the
// handler ran and answered with the replayed status, and the header's value
// says why the body is missing ("streamed", "too-large", "truncated" or
// "hijacked"; a handler that took the connection over before sending a
// status, or after a 101 Switching Protocols, answered on it unseen, and
// is replayed as 200 OK). A client must
// not run the request again to get the body; it can fetch the resource (the
// replay keeps Location) instead.
const BodyOmittedHeader = "Idempotent-Body-Omitted"

// write sends r to w, marked as a replay.
func (r *Response) write(w http.ResponseWriter) {
	r.writeHeader(w)
	_, _ = w.Write(r.Body)
	r.writeTrailers(w)
}

// writeHeader sends r's status and headers to w, marked as a replay, and
// declares its trailers.
func (r *Response) writeHeader(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set(ReplayedHeader, "true")
	if r.Omitted != "" {
		h.Set(BodyOmittedHeader, r.Omitted)
	}
	for name := range r.Trailer {
		h.Add("Trailer", name)
	}
	w.WriteHeader(r.Status)
}

// writeTrailers sets r's trailers, declared by writeHeader, once the body
// is written: net/http sends them after it.
func (r *Response) writeTrailers(w http.ResponseWriter) {
	h := w.Header()
	for name, v := range r.Trailer {
		h[name] = append([]string(nil), v...)
	}
}

// neverStored are headers that are never remembered, whatever the options:
// credentials, hop-by-hop headers that describe one connection, and what
// net/http makes afresh for each response.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Proxy-Authorization": true, "Proxy-Authenticate": true,
	"Www-Authenticate": true, "Authentication-Info": true, "Proxy-Authentication-Info": true, "Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Date": true,
	ReplayedHeader: true, BodyOmittedHeader: true,
}

// bodyHeaders describe a body's bytes: a response replayed without its body
// does not carry them.
var bodyHeaders = []string{"Content-Type", "Content-Encoding", "Content-Range", "Content-Disposition", "Content-Digest", "Repr-Digest", "Digest"}

// A headerPolicy says which response headers are remembered.
type headerPolicy struct {
	only map[string]bool // nil: every header but the skipped ones
	skip map[string]bool
}

func newHeaderPolicy(only, skip []string) headerPolicy {
	set := func(names []string) map[string]bool {
		if names == nil {
			return nil
		}
		m := make(map[string]bool, len(names))
		for _, n := range names {
			m[http.CanonicalHeaderKey(n)] = true
		}
		return m
	}
	return headerPolicy{only: set(only), skip: set(skip)}
}

// bodyCoding are the headers that say what a stored body's bytes are:
// remembered with the body whatever StoredHeaders and SkipHeaders say,
// since the bytes replayed without them are not the answer (gzip bytes
// with no Content-Encoding). A response replayed without its body drops
// them with the other bodyHeaders.
var bodyCoding = map[string]bool{"Content-Encoding": true, "Content-Range": true}

// keeps reports whether the header with canonical name is remembered.
func (p headerPolicy) keeps(name string) bool {
	switch {
	case neverStored[name]:
		return false
	case bodyCoding[name]:
		return true
	case p.skip[name]:
		return false
	}
	return p.only == nil || p.only[name]
}

// recorder passes a handler's response through to the client as it is
// written, and keeps a copy to remember: the status, the allowed headers as
// they stood when the response was sent, the body up to maxBody, and the
// trailers as they stand when the handler returns.
//
// A client that hangs up mid-response is the lost reply idempotency keys
// exist for, so its write error is not the handler's: the recorder keeps
// taking the body, for the retry to replay whole, and tells the handler
// only once nothing more of it can be remembered (streamed, or past
// maxBody).
type recorder struct {
	w       http.ResponseWriter
	headers headerPolicy
	maxBody int

	resp      Response
	oversized bool  // the body passed maxBody: remembered without it
	streamed  bool  // the handler flushed: remembered without the body
	hijacked  bool  // the handler took the connection over: it answers there, unseen
	released  bool  // ReleaseKey: the handler failed without a response
	clientErr error // the first failed write to the client, which is gone

	// held: the transactional mode. Nothing but an informational status
	// reaches w until the handler's transaction commits (send); a
	// response that cannot wait for that (streamed, hijacked, larger than
	// maxBody) is refused, and refused says why.
	held    bool
	refused error
	header  http.Header // held: the headers as they stood at WriteHeader, which net/http would have sent

	before   http.Header // the headers set before the handler ran (outer middleware's): not the handler's to remember
	declared int64       // the Content-Length the response was sent with; -1 if none
	written  int64       // body bytes the handler wrote

	// mu orders the handler's calls, from whatever goroutine, against
	// end: once the handler has returned, nothing more of its is taken,
	// so the response recorded (and, held, the one sent) is the one it
	// returned with.
	mu    sync.Mutex
	ended bool
}

// errAfterReturn fails a write made after the handler returned.
var errAfterReturn = errors.New("idemhttp: the handler wrote after it returned; the response was recorded without it")

// end marks the handler returned: its later calls are refused.
func (r *recorder) end() {
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
}

// ReleaseKey tells the guard whose handler writes to w that the handler
// failed before writing any response, as frameworks whose error handling
// writes the error after the handler returns need to (idemgin, for errors
// that gin middleware outside the guard renders): the key is released and
// nothing is remembered, so a retry runs the handler again. It reports
// false, and changes nothing, if w is not a guarded handler's writer or a
// response has already been started. A response the handler writes after
// it is remembered as any other.
func ReleaseKey(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *recorder:
			x.mu.Lock()
			defer x.mu.Unlock()
			if x.ended || x.resp.Status != 0 || x.streamed || x.hijacked {
				return false
			}
			x.released = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

func newRecorder(w http.ResponseWriter, headers headerPolicy, maxBody int) *recorder {
	return &recorder{w: w, headers: headers, maxBody: maxBody, declared: -1}
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.ended {
		r.writeHeader(code)
	}
}

func (r *recorder) writeHeader(code int) {
	if r.resp.Status != 0 {
		return // net/http ignores it too, with a log line
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		r.w.WriteHeader(code) // informational: passed on, not the response
		return
	}
	// A response after ReleaseKey is the handler's answer after all:
	// remembered as any other, whole.
	r.released = false
	if r.held {
		if code < 100 || code > 999 {
			panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does: nothing is sent
		}
		r.keepDeclared()
		r.keepHeaders()
		r.header = r.w.Header().Clone()
		r.resp.Status = code
		return
	}
	r.keepDeclared()
	r.keepHeaders()
	saved := r.resp.Header
	r.resp.Header = nil
	r.w.WriteHeader(code) // panics, as net/http does, on an invalid code: nothing is sent
	r.resp.Status, r.resp.Header = code, saved
}

// keepDeclared notes the Content-Length the response is sent with.
func (r *recorder) keepDeclared() {
	if cl := r.w.Header().Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil {
			r.declared = n
		}
	}
}

// keepHeaders copies the headers to remember as they stand when the
// response is sent; trailers are taken when the handler returns.
func (r *recorder) keepHeaders() {
	h := r.w.Header()
	for name, v := range h {
		// net/http sends a key set without canonicalising as it is: judge
		// it by its canonical name, so "set-cookie" is Set-Cookie.
		canon := http.CanonicalHeaderKey(name)
		if strings.HasPrefix(name, http.TrailerPrefix) || !r.headers.keeps(canon) || slices.Equal(r.before[name], v) {
			continue
		}
		if r.resp.Header == nil {
			r.resp.Header = make(http.Header)
		}
		r.resp.Header[name] = append([]string(nil), v...)
	}
}

// keepTrailers copies the trailers to remember, once the handler has
// returned: the values of the names its Trailer header declared, and the
// keys it set with http.TrailerPrefix, each judged by its name as a header
// is, so that "Trailer:Set-Cookie" is never stored either.
func (r *recorder) keepTrailers() {
	h := r.w.Header()
	keep := func(name string, v []string) {
		if len(v) == 0 || !r.headers.keeps(name) {
			return
		}
		if r.resp.Trailer == nil {
			r.resp.Trailer = make(http.Header)
		}
		r.resp.Trailer[name] = append(r.resp.Trailer[name], v...)
	}
	for name := range trailerNames(h) {
		keep(name, h[name])
	}
	for key, v := range h {
		if name, ok := strings.CutPrefix(key, http.TrailerPrefix); ok && !badTrailers[http.CanonicalHeaderKey(name)] {
			keep(http.CanonicalHeaderKey(name), v)
		}
	}
}

// badTrailers are the names net/http never sends as trailers (as
// golang.org/x/net/http/httpguts.ValidTrailerHeader says): declared as
// trailers, they are sent as headers, so they are kept as headers.
var badTrailers = map[string]bool{
	"Authorization": true, "Cache-Control": true, "Connection": true, "Content-Encoding": true,
	"Content-Length": true, "Content-Range": true, "Content-Type": true, "Expect": true, "Host": true,
	"Keep-Alive": true, "Max-Forwards": true, "Pragma": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Range": true, "Realm": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Www-Authenticate": true,
}

// trailerNames returns the canonical names h's Trailer header declares
// that net/http sends as trailers.
func trailerNames(h http.Header) map[string]bool {
	var names map[string]bool
	for _, v := range h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = http.CanonicalHeaderKey(strings.TrimSpace(name)); name != "" && !badTrailers[name] {
				if names == nil {
					names = make(map[string]bool)
				}
				names[name] = true
			}
		}
	}
	return names
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return 0, errAfterReturn
	}
	if r.resp.Status == 0 {
		r.writeHeader(http.StatusOK)
	}
	if r.held {
		return r.hold(p)
	}
	if !r.oversized {
		if len(r.resp.Body)+len(p) > r.maxBody {
			r.oversized, r.resp.Body = true, nil
		} else {
			r.resp.Body = append(r.resp.Body, p...)
		}
	}
	r.written += int64(len(p))
	if r.clientErr == nil {
		n, err := r.w.Write(p)
		if err == nil || !r.complete() {
			return n, err
		}
		if errors.Is(err, http.ErrContentLength) || errors.Is(err, http.ErrBodyNotAllowed) {
			return n, err // the handler's mistake, not a gone client: it is told
		}
		r.clientErr = err // the client is gone: the body goes on being kept
	}
	if !r.complete() {
		return 0, r.clientErr // nothing more can be remembered: let the handler stop
	}
	return len(p), nil
}

// Flush sends what was written so far: the response is streamed, so it is
// not remembered.
func (r *recorder) Flush() { _ = r.FlushError() }

// FlushError is Flush that says whether it flushed, for
// http.ResponseController.
func (r *recorder) FlushError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return errAfterReturn
	}
	if r.held {
		r.refuse(errStreamedInTx)
		return errStreamedInTx
	}
	if r.resp.Status == 0 {
		r.writeHeader(http.StatusOK) // what net/http sends on a flush before WriteHeader
	}
	err := http.NewResponseController(r.w).Flush()
	if err == nil {
		r.streamed = true
	}
	return err
}

// Hijack hands the connection to the handler, which answers on it: the
// response is remembered without what it writes there (see response).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return nil, nil, errAfterReturn
	}
	if r.held {
		r.refuse(errHijackedInTx)
		return nil, nil, errHijackedInTx
	}
	conn, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil {
		r.hijacked = true
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the client's ResponseWriter for
// what the recorder does not handle itself.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// complete reports whether the recorder holds the whole response: it was
// neither streamed, hijacked nor larger than maxBody.
func (r *recorder) complete() bool {
	return !r.oversized && !r.streamed && !r.hijacked && !r.released && r.refused == nil
}

// response returns what the handler sent, and whether it is remembered:
// its status is 2xx, 3xx, or 4xx but 408, 409, 425 and 429. A remembered
// response whose body the recorder does not hold whole is remembered
// without it (Omitted says why): the handler finished, so its key must
// never run again.
//
// A handler that took the connection over before sending a status (as
// container APIs' attach endpoints do), or after a 101 Switching
// Protocols (as WebSocket libraries upgrade), answered on it, in a
// protocol the recorder does not read: it finished all the same, so it
// is remembered as done, a 200 OK with no headers and no body, Omitted
// "hijacked". A 101 is no answer to replay: a retry cannot switch.
func (r *recorder) response() (Response, bool) {
	if r.hijacked && (r.resp.Status == 0 || r.resp.Status == http.StatusSwitchingProtocols) {
		return Response{Status: http.StatusOK, Omitted: "hijacked"}, true
	}
	if r.released && r.resp.Status == 0 && !r.streamed {
		return r.resp, false
	}
	if r.resp.Status == 0 && !r.streamed {
		r.resp.Status = http.StatusOK // the handler wrote nothing: net/http sends 200
		r.keepHeaders()
	}
	r.keepTrailers()
	resp := r.resp
	if !remembered(resp.Status) {
		return resp, false
	}
	short := r.declared >= 0 && r.written != r.declared && resp.Status != http.StatusNoContent && resp.Status != http.StatusNotModified
	if !r.complete() || short {
		resp.Body, resp.Omitted = nil, "too-large"
		if short {
			resp.Omitted = "truncated"
		}
		if r.streamed {
			resp.Omitted = "streamed"
		}
		if r.hijacked {
			resp.Omitted = "hijacked"
		}
		for _, h := range bodyHeaders {
			delete(resp.Header, h)
			delete(resp.Trailer, h)
		}
	}
	return resp, true
}

// remembered reports whether a response with status is an outcome to keep
// and replay: 2xx, 3xx, and 4xx but those that invite a retry.
func remembered(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// responseJSON is a Response in JSON, the store's default Codec. A header
// value that is not valid UTF-8 (obs-text bytes are legal in HTTP) would
// come back mangled as a JSON string, so such a header travels as bytes.
type responseJSON struct {
	Status     int                 `json:"status"`
	Header     http.Header         `json:"header,omitempty"`
	RawHeader  map[string][][]byte `json:"raw_header,omitempty"`
	Body       []byte              `json:"body,omitempty"`
	Omitted    string              `json:"omitted,omitempty"`
	Trailer    http.Header         `json:"trailer,omitempty"`
	RawTrailer map[string][][]byte `json:"raw_trailer,omitempty"`
}

func (r Response) MarshalJSON() ([]byte, error) {
	j := responseJSON{Status: r.Status, Body: r.Body, Omitted: r.Omitted}
	j.Header, j.RawHeader = splitUTF8(r.Header)
	j.Trailer, j.RawTrailer = splitUTF8(r.Trailer)
	return json.Marshal(j)
}

func (r *Response) UnmarshalJSON(data []byte) error {
	var j responseJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*r = Response{Status: j.Status, Header: joinRaw(j.Header, j.RawHeader), Body: j.Body, Omitted: j.Omitted, Trailer: joinRaw(j.Trailer, j.RawTrailer)}
	return nil
}

// splitUTF8 splits h into the fields whose values are all valid UTF-8 and
// the rest, as bytes.
func splitUTF8(h http.Header) (http.Header, map[string][][]byte) {
	var text http.Header
	var raw map[string][][]byte
	for name, values := range h {
		if allUTF8(values) {
			if text == nil {
				text = make(http.Header)
			}
			text[name] = values
			continue
		}
		if raw == nil {
			raw = make(map[string][][]byte)
		}
		for _, v := range values {
			raw[name] = append(raw[name], []byte(v))
		}
	}
	return text, raw
}

// joinRaw is splitUTF8 undone.
func joinRaw(h http.Header, raw map[string][][]byte) http.Header {
	for name, values := range raw {
		if h == nil {
			h = make(http.Header)
		}
		for _, v := range values {
			h[name] = append(h[name], string(v))
		}
	}
	return h
}

func allUTF8(values []string) bool {
	for _, v := range values {
		if !utf8.ValidString(v) {
			return false
		}
	}
	return true
}
