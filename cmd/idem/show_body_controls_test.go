package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// show prints a stored response's body as text, but never the control
// characters in it: a body a client chose (a name echoed back) must not
// reach the operator's terminal as escape sequences that clear the
// screen, retitle the window, write the clipboard (OSC 52) or, with a
// carriage return, print over what show says. They are printed escaped,
// as Go writes them in a string literal; newlines and tabs are kept.
func TestShowEscapesControlCharactersInABody(t *testing.T) {
	for name, body := range map[string]string{
		"text": "hello\x1b]52;c;cHduZWQ=\a\x1b[2J\rstate: completed\u009b31m\x7f\nline two\tend",
		"json": "{\"note\":\"ok\u009b31m\x7f\"}",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "http.db")
			b, err := bolt.Open(path, nil)
			require.NoError(t, err)
			s := idem.New[idemhttp.Response](idem.Options{Backend: b})
			h := idemhttp.Middleware(s, idemhttp.Options{Unscoped: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(body))
			}))
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
			r.Header.Set("Idempotency-Key", "k1")
			h.ServeHTTP(httptest.NewRecorder(), r)
			require.NoError(t, s.Close())
			require.NoError(t, b.Close())

			code, out, errs := runCmd("show", path, "k1", "-scope", "")
			require.Equal(t, 0, code, errs)
			for _, c := range []string{"\x1b", "\x07", "\r", "\u009b", "\x7f"} {
				assert.NotContains(t, out, c, "a control character reaches the terminal")
			}
			assert.Contains(t, out, `\u009b31m\x7f`)
			if name == "text" {
				assert.Contains(t, out, `hello\x1b]52;c;cHduZWQ=\a\x1b[2J\rstate: completed`)
				assert.Contains(t, out, "\n    line two\tend\n", "newlines and tabs are kept")
			}
		})
	}
}
