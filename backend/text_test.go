package backend

import "testing"

// StorableText leaves text a text column holds as it is, and marks each
// NUL byte, and each run of bytes that are not UTF-8, with U+FFFD.
func TestStorableTextMarksWhatATextColumnCannotHold(t *testing.T) {
	for in, want := range map[string]string{
		"":                       "",
		"declined: card expired": "declined: card expired",
		"naïve ✓":                "naïve ✓",
		"nul \x00 here":          "nul \uFFFD here",
		"raw \xff\xfe bytes":     "raw \uFFFD bytes",
	} {
		if got := StorableText(in); got != want {
			t.Errorf("StorableText(%q) = %q, want %q", in, got, want)
		}
	}
}
