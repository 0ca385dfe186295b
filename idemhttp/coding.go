package idemhttp

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// A stored response is replayed in the content coding it was stored in
// (the handler's, such as a gzip middleware's inside the guard) when the
// retry accepts it, as RFC 9110 (12.5.3) reads Accept-Encoding. When it
// does not, as for a retry that asks for identity, the coding is undone on
// replay: gzip and deflate, the codings Go can decode. Any other, a
// range of the encoded bytes (Content-Range), or a retry that accepts
// neither the stored coding nor identity, is answered 406, and a stored
// body that does not decode, 500: never bytes the client cannot read. A
// body that decodes to more than one layer of gzip can hold (a gzip bomb)
// is 406 too, so that no retry costs the server more to decode than its
// stored bytes times 1032.

// errNotAcceptable is the cause of a 406 for a replay in a coding the
// retry does not accept and that cannot be undone.
var errNotAcceptable = errors.New("idemhttp: the stored response's content coding is not acceptable to the retry")

// acceptEncoding is a request's Accept-Encoding field: the weight it gives
// each content coding it names, "*" (any other) included.
type acceptEncoding struct {
	present bool               // the request has the field; an empty one asks for identity alone
	q       map[string]float64 // by lower-case coding; x-gzip is gzip
}

// parseAcceptEncoding reads the Accept-Encoding fields in h. An element
// that does not parse (a bad weight) is ignored, as if not sent: its
// coding is then accepted only through "*", so a stored coding is undone
// rather than sent to a client that may not read it. A coding named twice
// keeps its lowest weight, for the same reason.
func parseAcceptEncoding(h http.Header) acceptEncoding {
	values := h.Values("Accept-Encoding")
	a := acceptEncoding{present: len(values) > 0}
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(elem, ";")
			coding = canonicalCoding(coding)
			if coding == "" {
				continue
			}
			q, ok := 1.0, true
			for p := range strings.SplitSeq(params, ";") {
				name, value, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(name), "q") {
					q, ok = parseQ(strings.TrimSpace(value))
				}
			}
			if !ok {
				continue
			}
			if a.q == nil {
				a.q = make(map[string]float64)
			}
			if old, seen := a.q[coding]; !seen || q < old {
				a.q[coding] = q
			}
		}
	}
	return a
}

// parseQ reads a weight: "0" to "1" with at most three decimals.
func parseQ(s string) (float64, bool) {
	if s == "" || len(s) > 5 || (s[0] != '0' && s[0] != '1') {
		return 0, false
	}
	q, err := strconv.ParseFloat(s, 64)
	return q, err == nil && q >= 0 && q <= 1
}

// canonicalCoding is a content coding's name in lower case, with the
// x-gzip and x-compress aliases RFC 9110 (8.4.1) names read as gzip and
// compress.
func canonicalCoding(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "x-gzip":
		return "gzip"
	case "x-compress":
		return "compress"
	}
	return s
}

// accepts reports whether a request with a accepts coding: without the
// field, any; else the coding's own weight, or else the weight of "*",
// must be above zero; identity, named by neither, is accepted.
func (a acceptEncoding) accepts(coding string) bool {
	if !a.present {
		return true
	}
	if q, ok := a.q[coding]; ok {
		return q > 0
	}
	if q, ok := a.q["*"]; ok {
		return q > 0
	}
	return coding == "identity"
}

// storedCodings returns the content codings of resp's body, in the order
// they were applied, and the names of its Content-Encoding fields (a
// handler may have set one in any case).
func storedCodings(resp *Response) (codings, fields []string) {
	for name, values := range resp.Header {
		if http.CanonicalHeaderKey(name) != "Content-Encoding" {
			continue
		}
		fields = append(fields, name)
		for _, v := range values {
			for c := range strings.SplitSeq(v, ",") {
				if c = canonicalCoding(c); c != "" && c != "identity" {
					codings = append(codings, c)
				}
			}
		}
	}
	return codings, fields
}

// undoCodings returns the codings to take off resp's body for a request
// with header h: none if it accepts them all, all of them otherwise. It
// returns errNotAcceptable, with the codings, if they cannot be undone (a
// coding other than gzip and deflate, with a body; a range of the encoded
// bytes, with Content-Range) or the request does not accept identity
// either.
func undoCodings(h http.Header, resp *Response) ([]string, error) {
	codings, _ := storedCodings(resp)
	a := parseAcceptEncoding(h)
	undo := false
	for _, c := range codings {
		undo = undo || !a.accepts(c)
	}
	if !undo {
		return nil, nil
	}
	if !a.accepts("identity") {
		return codings, fmt.Errorf("%w: it accepts neither %s nor identity", errNotAcceptable, strings.Join(codings, ", "))
	}
	for _, c := range codings {
		if c != "gzip" && c != "deflate" && len(resp.Body) > 0 {
			return codings, fmt.Errorf("%w: it does not accept %s, which cannot be undone here", errNotAcceptable, c)
		}
	}
	if hasField(resp.Header, "Content-Range") {
		// A range (a 206's, a 416's length) counts encoded bytes: the
		// decoded body is not the range it names.
		return codings, fmt.Errorf("%w: it does not accept %s, and a range of encoded bytes cannot be decoded", errNotAcceptable, strings.Join(codings, ", "))
	}
	return codings, nil
}

// hasField reports whether h has the field with the canonical name
// canon, under any case a handler set it in.
func hasField(h http.Header, canon string) bool {
	for name := range h {
		if http.CanonicalHeaderKey(name) == canon {
			return true
		}
	}
	return false
}

// maxRatio bounds a decoded body, in bytes per stored byte: deflate, in
// gzip, zlib or raw, holds at most 1032 bytes in one (its longest match,
// 258 bytes, takes at least two bits). A body that decodes to more was
// coded more than once, as a gzip bomb is, and is not decoded: a retry
// must not cost the server more than one layer of gzip can.
const maxRatio = 1032

// errTooLarge is why a stored body is not decoded: decoded, it would be
// larger than maxRatio times its stored size.
var errTooLarge = errors.New("idemhttp: the stored body decodes to more than one layer of gzip can hold")

// decode writes body with codings undone, the last applied first, to dst,
// and returns the decoded length. A body that does not decode whole, its
// checksum included, is an error, and so is one that decodes to more
// than maxRatio times its size (errTooLarge, when nothing past that was
// written); an empty body decodes to nothing.
func decode(dst io.Writer, body []byte, codings []string) (int64, error) {
	if len(body) == 0 {
		return 0, nil
	}
	var r io.Reader = bytes.NewReader(body)
	for i := len(codings) - 1; i >= 0; i-- {
		var err error
		switch codings[i] {
		case "gzip":
			r, err = gzip.NewReader(r)
		case "deflate": // HTTP's deflate is the zlib format (RFC 9110, 8.4.1.2)
			r, err = zlib.NewReader(r)
		}
		if err != nil {
			return 0, fmt.Errorf("idemhttp: decoding the stored %s body: %w", codings[i], err)
		}
	}
	limit := int64(len(body)) * maxRatio
	n, err := io.Copy(dst, io.LimitReader(r, limit))
	if err != nil {
		return n, fmt.Errorf("idemhttp: decoding the stored %s body: %w", strings.Join(codings, ", "), err)
	}
	if n == limit {
		if m, _ := r.Read(make([]byte, 1)); m > 0 {
			return n, fmt.Errorf("%w (%s, %d bytes stored)", errTooLarge, strings.Join(codings, ", "), len(body))
		}
	}
	return n, nil
}

// codingHeaders describe the encoded bytes: a replay with its coding
// undone does not carry them.
var codingHeaders = []string{"Content-Digest", "Repr-Digest", "Digest"}

// decoded returns resp as it is replayed with its content coding undone:
// without Content-Encoding and the digests of the encoded bytes, and with
// a strong ETag made weak, since the bytes are not the ones it tags.
func decoded(resp Response) Response {
	_, fields := storedCodings(&resp)
	h := make(http.Header, len(resp.Header))
	for name, v := range resp.Header {
		h[name] = v
	}
	for _, name := range fields {
		delete(h, name)
	}
	for name, v := range h {
		canon := http.CanonicalHeaderKey(name)
		for _, drop := range codingHeaders {
			if canon == drop {
				delete(h, name)
			}
		}
		if canon == "Etag" && len(v) == 1 && !strings.HasPrefix(v[0], "W/") {
			h[name] = []string{"W/" + v[0]}
		}
	}
	resp.Header = h
	if resp.Trailer != nil {
		t := resp.Trailer.Clone()
		for _, name := range codingHeaders {
			t.Del(name)
		}
		resp.Trailer = t
	}
	return resp
}

// replay answers r with resp, marked as a replay, in a content coding r
// accepts (see above).
func (g *Guard) replay(w http.ResponseWriter, r *http.Request, resp Response, lk logKey) {
	g.replayTo(w, r.Header, func() *http.Request { return r }, resp, lk)
}

// replayTo is replay for a request with header h, made by req only when it
// must be answered otherwise (the refusals below), so that a replay made
// straight to the client costs no copy of the request.
func (g *Guard) replayTo(w http.ResponseWriter, h http.Header, req func() *http.Request, resp Response, lk logKey) {
	if resp.Status < 200 || resp.Status > 999 {
		// Never one the middleware records, but an operator's (idem
		// resolve -result '{}', Store.Resolve with a zero Response):
		// WriteHeader would panic, and a 1xx is no final answer.
		g.opts.Logger.Error("idemhttp: the key's recorded response has no final status to replay; it needs an operator", lk.with("status", resp.Status)...)
		g.fail(w, req(), http.StatusInternalServerError, "The request with this Idempotency-Key has a recorded response that cannot be sent; it needs an operator.", 0, fmt.Errorf("idemhttp: recorded status %d", resp.Status))
		return
	}
	codings, err := undoCodings(h, &resp)
	if err != nil {
		g.fail(w, req(), http.StatusNotAcceptable, "The response to this Idempotency-Key is kept in a content coding ("+strings.Join(codings, ", ")+") this request's Accept-Encoding does not accept; retry with the same key, accepting it.", 0, err)
		return
	}
	if codings == nil {
		resp.write(w)
		return
	}
	// Decoded twice: once to check the whole body decodes and learn its
	// length, before anything is sent, and once to send it, so that a
	// body that does not decode is a clear error, never a garbled answer,
	// and a large one is never held decoded in memory.
	n, err := decode(io.Discard, resp.Body, codings)
	if errors.Is(err, errTooLarge) {
		// A client can cause this at will: Debug, never a log flood.
		g.opts.Logger.Debug("idemhttp: a stored response is too large decoded for a retry that does not accept its content coding", lk.with("err", err)...)
		g.fail(w, req(), http.StatusNotAcceptable, "The response to this Idempotency-Key is kept in a content coding ("+strings.Join(codings, ", ")+") this request's Accept-Encoding does not accept, and decoded it is too large to send; retry with the same key, accepting it.", 0, err)
		return
	}
	if err != nil {
		g.opts.Logger.Error("idemhttp: a stored response does not decode for a retry that does not accept its content coding", lk.with("err", err)...)
		g.fail(w, req(), http.StatusInternalServerError, "The response to this Idempotency-Key is kept in a content coding ("+strings.Join(codings, ", ")+") this request's Accept-Encoding does not accept, and could not be decoded; retry with the same key, accepting it.", 0, err)
		return
	}
	resp = decoded(resp)
	if resp.Trailer == nil && n > 0 { // with trailers, net/http sends the body chunked; with none, it knows
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	}
	resp.writeHeader(w)
	_, _ = decode(w, resp.Body, codings)
	resp.writeTrailers(w)
}
