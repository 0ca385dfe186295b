package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// A problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers with an application/problem+json body. retryAfter,
// if positive, becomes a Retry-After header in whole seconds, at least one.
func writeProblem(w http.ResponseWriter, status int, detail string, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(max(time.Second, retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{
		Type:   "about:blank",
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
	})
}
