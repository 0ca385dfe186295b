package idemhttp

import (
	"encoding/json"
	"net/http"
)

// A Problem is why the middleware answers a request itself instead of
// running or replaying its handler. Options.WriteError turns it into a
// response.
type Problem struct {
	Status int    // the HTTP status to answer
	Detail string // for the client: what happened and what to do
	Err    error  // the cause, for errors.Is (idem.ErrPayloadMismatch, ...); nil for a malformed request
}

// problemJSON is an RFC 9457 problem details object.
type problemJSON struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WriteProblem is the default Options.WriteError: an RFC 9457
// application/problem+json body, not to be cached.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(problemJSON{
		Type:   "about:blank",
		Title:  http.StatusText(p.Status),
		Status: p.Status,
		Detail: p.Detail,
	})
}
