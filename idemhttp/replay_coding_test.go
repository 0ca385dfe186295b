package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// postAccepting posts to srv with key and, unless acceptEncoding is nil,
// that Accept-Encoding, through a client that decodes nothing itself, and
// returns the answer with its body as sent.
func postAccepting(t *testing.T, srv *httptest.Server, key string, acceptEncoding *string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set(idemhttp.Header, key)
	if acceptEncoding != nil {
		req.Header["Accept-Encoding"] = []string{*acceptEncoding}
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// A retry that does not accept the stored content coding (gzip, from a
// compression middleware inside the guard) gets the body decoded, without
// Content-Encoding and with its own length; one that accepts it gets the
// stored bytes; one that accepts neither it nor identity is 406. The
// handler runs once.
func TestReplayUndoesACodingTheRetryDoesNotAccept(t *testing.T) {
	h := &charges{}
	srv := serve(t, gzipped(h), idemhttp.Options{Unscoped: true})
	first, body := post(t, srv.Client(), srv.URL, "k", "{}")
	require.True(t, first.Uncompressed, "the first answer was gzip")
	gzipBytes := func() string {
		_, b := postAccepting(t, srv, "k", ptr("gzip"))
		return b
	}()
	require.NotEqual(t, body, gzipBytes)

	for _, tc := range []struct {
		accept *string // nil: no Accept-Encoding field
		want   string  // "plain", "gzip" or "406"
	}{
		{nil, "gzip"}, // no preference: any coding
		{ptr("gzip"), "gzip"},
		{ptr("x-gzip"), "gzip"},
		{ptr("GZIP;Q=0.5"), "gzip"},
		{ptr("*"), "gzip"},
		{ptr("br;q=1, *;q=0.1"), "gzip"},
		{ptr("identity;q=0, gzip"), "gzip"},
		{ptr("identity"), "plain"},
		{ptr(""), "plain"}, // an empty field asks for identity
		{ptr("br"), "plain"},
		{ptr("gzip;q=0"), "plain"},
		{ptr("gzip;q=0.000, deflate"), "plain"},
		{ptr("gzip;q=0.5, gzip;q=0"), "plain"},
		{ptr("gzip;q=2"), "plain"}, // not a weight: as if not named
		{ptr("*;q=0, identity"), "plain"},
		{ptr("gzip;q=0, identity;q=0"), "406"},
		{ptr("*;q=0"), "406"},
	} {
		name := "absent"
		if tc.accept != nil {
			name = strconv.Quote(*tc.accept)
		}
		t.Run(name, func(t *testing.T) {
			retry, got := postAccepting(t, srv, "k", tc.accept)
			switch tc.want {
			case "gzip":
				assert.Equal(t, http.StatusCreated, retry.StatusCode)
				assert.Equal(t, "gzip", retry.Header.Get("Content-Encoding"))
				assert.Equal(t, gzipBytes, got)
			case "plain":
				assert.Equal(t, http.StatusCreated, retry.StatusCode)
				assert.Equal(t, "true", retry.Header.Get(idemhttp.ReplayedHeader))
				assert.Empty(t, retry.Header.Get("Content-Encoding"), "the coding is undone")
				assert.Equal(t, body, got)
				assert.Equal(t, int64(len(body)), retry.ContentLength)
				assert.Equal(t, "application/json", retry.Header.Get("Content-Type"))
			case "406":
				assert.Equal(t, http.StatusNotAcceptable, retry.StatusCode)
				assert.Empty(t, retry.Header.Get("Content-Encoding"))
			}
		})
	}
	assert.Equal(t, int32(1), h.n.Load())
}

// A stored body that is not what its Content-Encoding says cannot be
// decoded for a retry that does not accept the coding: the retry gets a
// clear 500, not the stored bytes under another label; and a coding Go
// cannot undo is 406. A retry that accepts the coding still gets the
// stored bytes.
func TestReplayThatCannotBeDecodedIsAnError(t *testing.T) {
	for _, coding := range []string{"gzip", "deflate", "br"} {
		t.Run(coding, func(t *testing.T) {
			var runs atomic.Int32
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Content-Encoding", coding)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "not "+coding+" at all")
			}), idemhttp.Options{Unscoped: true, Logger: quiet()})
			postAccepting(t, srv, "k", ptr(coding))
			retry, got := postAccepting(t, srv, "k", ptr("identity"))
			want := http.StatusInternalServerError
			if coding == "br" {
				want = http.StatusNotAcceptable
			}
			assert.Equal(t, want, retry.StatusCode)
			assert.Empty(t, retry.Header.Get("Content-Encoding"))
			assert.Contains(t, retry.Header.Get("Content-Type"), "application/problem+json")
			assert.NotContains(t, got, "at all", "never the stored bytes")
			again, got := postAccepting(t, srv, "k", ptr(coding))
			assert.Equal(t, http.StatusCreated, again.StatusCode)
			assert.Equal(t, "not "+coding+" at all", got)
			assert.Equal(t, int32(1), runs.Load())
		})
	}
}

// A coding undone on replay takes off what describes the encoded bytes:
// a strong ETag becomes weak, and a Content-Digest goes.
func TestReplayUndoingACodingWeakensTheETag(t *testing.T) {
	srv := serve(t, gzipped(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Content-Digest", "sha-256=:AAAA:")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "receipt")
	})), idemhttp.Options{Unscoped: true})
	postAccepting(t, srv, "k", ptr("gzip"))
	retry, got := postAccepting(t, srv, "k", ptr("identity"))
	assert.Equal(t, "receipt", got)
	assert.Equal(t, `W/"v1"`, retry.Header.Get("ETag"))
	assert.Empty(t, retry.Header.Get("Content-Digest"))
	same, _ := postAccepting(t, srv, "k", ptr("gzip"))
	assert.Equal(t, `"v1"`, same.Header.Get("ETag"), "the stored coding keeps its tag")
}

// A stored partial answer (206, a range of the gzip bytes) cannot be
// decoded for a retry that does not accept gzip: its Content-Range
// counts encoded bytes, so the decoded body would not be that range.
// The retry gets 406, not a body its Content-Range misdescribes; one
// that accepts gzip gets the stored range.
func TestReplayOfARangeIsNeverDecoded(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	io.WriteString(zw, strings.Repeat("receipt ", 100))
	zw.Close()
	n := zipped.Len()
	var runs atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", n-1, n))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(zipped.Bytes())
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	postAccepting(t, srv, "k", ptr("gzip"))
	retry, got := postAccepting(t, srv, "k", ptr("identity"))
	assert.Equal(t, http.StatusNotAcceptable, retry.StatusCode, "Content-Range %q with %d bytes", retry.Header.Get("Content-Range"), len(got))
	assert.Empty(t, retry.Header.Get("Content-Range"))
	same, got := postAccepting(t, srv, "k", ptr("gzip"))
	assert.Equal(t, http.StatusPartialContent, same.StatusCode)
	assert.Equal(t, zipped.String(), got)
	assert.Equal(t, int32(1), runs.Load())
}

// A body stored under several codings (gzip, then br) is replayed as it
// is to a retry that accepts both, and is 406 for one that accepts only
// one of them (br cannot be undone here): never half decoded.
func TestReplayOfSeveralCodings(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip, br")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "brotli of gzip")
	}), idemhttp.Options{Unscoped: true, Logger: quiet()})
	postAccepting(t, srv, "k", ptr("gzip, br"))
	for accept, want := range map[string]int{"gzip, br": http.StatusCreated, "br": http.StatusNotAcceptable, "gzip": http.StatusNotAcceptable, "identity": http.StatusNotAcceptable} {
		retry, got := postAccepting(t, srv, "k", ptr(accept))
		assert.Equal(t, want, retry.StatusCode, accept)
		if want == http.StatusCreated {
			assert.Equal(t, "brotli of gzip", got)
			assert.Equal(t, "gzip, br", retry.Header.Get("Content-Encoding"))
		} else {
			assert.NotContains(t, got, "brotli of gzip", accept)
		}
	}
}

// gzipOf returns b gzipped.
func gzipOf(b []byte) []byte {
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zw.Write(b)
	zw.Close()
	return z.Bytes()
}

// A stored body gzipped twice (a handler that passed on what another
// service sent, a gzip bomb) is not decoded past what one layer of gzip
// can hold, 1032 bytes a stored byte: a retry that accepts only identity
// gets 406, and costs the server no more than that, while a body one
// layer of gzip made is decoded whole.
func TestReplayDecodesNoMoreThanOneLayerOfGzipCanHold(t *testing.T) {
	zeros := make([]byte, 64<<20)
	bomb := gzipOf(gzipOf(zeros))
	one := gzipOf(zeros[:4<<20])
	for _, tc := range []struct {
		name     string
		coding   string
		body     []byte
		status   int
		replayed int
	}{
		{"gzip of gzip", "gzip, gzip", bomb, http.StatusNotAcceptable, 0},
		{"one layer", "gzip", one, http.StatusCreated, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Encoding", tc.coding)
				w.WriteHeader(http.StatusCreated)
				w.Write(tc.body)
			}), idemhttp.Options{Unscoped: true, Logger: quiet()})
			postAccepting(t, srv, "k", ptr("gzip"))
			retry, got := postAccepting(t, srv, "k", ptr("identity"))
			assert.Equal(t, tc.status, retry.StatusCode, "%d stored bytes replayed as %d", len(tc.body), len(got))
			if tc.status == http.StatusCreated {
				assert.Len(t, got, tc.replayed)
			}
		})
	}
}

func ptr(s string) *string { return &s }
