package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/seed094d4201/idem/idemhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// responseFields are the JSON fields of a stored idemhttp.Response: a
// value whose fields are all among them, with a status, is taken for one.
var responseFields = map[string]bool{"status": true, "header": true, "raw_header": true, "body": true, "omitted": true, "trailer": true, "raw_trailer": true}

// asResponse decodes b as a stored idemhttp.Response, if it is one.
func asResponse(b []byte) (idemhttp.Response, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil || fields["status"] == nil {
		return idemhttp.Response{}, false
	}
	for name := range fields {
		if !responseFields[name] {
			return idemhttp.Response{}, false
		}
	}
	var r idemhttp.Response
	if json.Unmarshal(b, &r) != nil || r.Status < 100 || r.Status > 999 {
		return idemhttp.Response{}, false
	}
	return r, true
}

// writeValue prints a record's value under label: an idemhttp response as
// its status, headers and body; JSON as JSON (indented when it does not
// fit a line); other UTF-8 text quoted; anything else in hex.
func writeValue(w io.Writer, label string, b []byte) {
	if r, ok := asResponse(b); ok {
		fmt.Fprintf(w, "%-12s idemhttp response %d\n", label+":", r.Status)
		writeHeader(w, "header", r.Header)
		switch {
		case r.Omitted != "":
			fmt.Fprintf(w, "  body:      not kept (%s)\n", escapeControls(r.Omitted))
		case len(r.Body) == 0:
			fmt.Fprintln(w, "  body:      empty")
		default:
			fmt.Fprintf(w, "  body:      %d bytes\n", len(r.Body))
			writeBody(w, r.Body)
		}
		writeHeader(w, "trailer", r.Trailer)
		return
	}
	fmt.Fprintf(w, "%-12s %s\n", label+":", inline(b))
}

// inline is b on one line: JSON as it is (compacted), other UTF-8 text
// quoted, else hex; "none" for no bytes.
func inline(b []byte) string {
	switch {
	case len(b) == 0:
		return "none"
	case json.Valid(b):
		var compact bytes.Buffer
		if json.Compact(&compact, b) == nil {
			return escapeControls(compact.String()) // a JSON string may hold DEL and C1 controls as they are
		}
	case utf8.Valid(b):
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("hex %x", b)
}

func writeHeader(w io.Writer, what string, h map[string][]string) {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, v := range h[name] {
			// The name as the handler set it, which the recorder keeps
			// whatever its bytes: escaped, as a body is.
			fmt.Fprintf(w, "  %s %s: %q\n", what, escapeControls(name), v)
		}
	}
}

// writeBody prints a response body indented: JSON indented, other UTF-8
// text as it is, anything else in hex; control characters but newlines and
// tabs escaped (escapeControls).
func writeBody(w io.Writer, body []byte) {
	var out string
	var ind bytes.Buffer
	switch {
	case json.Valid(body) && json.Indent(&ind, body, "    ", "  ") == nil:
		out = ind.String()
	case utf8.Valid(body):
		out = strings.ReplaceAll(strings.TrimRight(string(body), "\n"), "\n", "\n    ")
	default:
		out = fmt.Sprintf("hex %x", body)
	}
	fmt.Fprintf(w, "    %s\n", escapeControls(out))
}

// escapeControls returns s with its control characters (C0, DEL, C1) but
// newline and tab written as Go writes them in a string literal (\x1b,
// \r, \u009b): a body is what a client chose, and must not reach the
// operator's terminal as escape sequences, nor a carriage return print
// over what idem says.
func escapeControls(s string) string {
	if !strings.ContainsFunc(s, isEscaped) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isEscaped(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isEscaped(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }

// replyFields are the fields of an idemgrpc reply in JSON (its default
// Codec's form).
var replyFields = map[string]bool{"message": true, "header": true, "trailer": true, "code": true, "error": true, "status": true, "omitted": true}

// A replyShape is what the shape check reads of an idemgrpc reply.
type replyShape struct {
	Message []byte     `json:"message"`
	Code    codes.Code `json:"code"`
	Status  []byte     `json:"status"`
	Omitted int        `json:"omitted"`
}

// asReply reads b as an idemgrpc reply, as the Codec does: an object with
// no field a reply lacks (its names in any case, as encoding/json matches
// them), a code as codes.Code's JSON (a number below codes' end, or a name
// such as "NOT_FOUND"), and a message, if any, a google.protobuf.Any that
// names its type. ok is false if b is none.
func asReply(b []byte) (r replyShape, ok bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil || len(fields) == 0 || json.Unmarshal(b, &r) != nil {
		return replyShape{}, false
	}
	for name := range fields {
		if !isReplyField(name) {
			return replyShape{}, false
		}
	}
	if len(r.Message) > 0 && !isAny(r.Message) {
		return replyShape{}, false
	}
	return r, true
}

// answer reports whether r holds an answer a replay can send: a response
// message, a response too large to have been kept (omitted), or a final
// error's code.
func (r replyShape) answer() bool {
	return len(r.Message) > 0 || r.Omitted > 0 || r.Code != codes.OK
}

// written reports whether r is a reply as the interceptor writes one, so
// that a store holding it holds idemgrpc replies: a message, a response's
// size, or an error's code with its whole status. An application's own
// result may have a "code" and a "message" too, but not so.
func (r replyShape) written() bool {
	return len(r.Message) > 0 || r.Omitted > 0 || (r.Code != codes.OK && len(r.Status) > 0)
}

// isAny reports whether b is a google.protobuf.Any in wire form that names
// its type, as a reply's message is: a replay decodes it so, and fails as
// Internal if it cannot.
func isAny(b []byte) bool {
	var a anypb.Any
	return proto.Unmarshal(b, &a) == nil && a.TypeUrl != ""
}

// isReplyField reports whether encoding/json matches name to a field of a
// reply.
func isReplyField(name string) bool {
	for field := range replyFields {
		if strings.EqualFold(name, field) {
			return true
		}
	}
	return false
}
