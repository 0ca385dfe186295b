package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// show on a key whose steps hold binary values, a name with control bytes
// and a final error with terminal escapes: text output quotes everything
// (no raw control bytes reach the terminal), and -json gives the value as
// hex.
func TestShowQuotesBinarySteps(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "steps.bolt")
	b, err := bolt.Open(path, nil)
	require.NoError(t, err)
	at := now.Add(-3 * time.Hour)
	claim, _, err := b.Claim(ctx, backend.Record{Key: "k", Token: "t"}, at, time.Hour)
	require.NoError(t, err)
	bin := []byte{0x00, 0xff, 0x1b, '[', '2', 'J', 0xfe}
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "bin\x1b[31m", Value: bin}, at))
	require.NoError(t, b.RecordStep(ctx, "k", claim.Token, backend.Step{Name: "esc", Failed: true, ErrMsg: "no\x1b]0;pwned\x07", Value: []byte("\x1b[2J")}, at))
	require.NoError(t, b.Close())

	code, out, errs := runCmd("show", path, "k")
	require.Equal(t, 0, code, errs)
	assert.NotContains(t, out, "\x1b", "raw escape bytes reach the terminal")
	assert.Contains(t, out, "hex 00ff1b5b324afe")

	code, out, errs = runCmd("show", path, "k", "-json")
	require.Equal(t, 0, code, errs)
	var v struct {
		Steps []struct {
			Name       string  `json:"name"`
			ValueHex   *string `json:"value_hex"`
			Value      *string `json:"value"`
			FinalError *string `json:"final_error"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &v), out)
	require.Len(t, v.Steps, 2)
	require.NotNil(t, v.Steps[0].ValueHex)
	assert.Equal(t, "00ff1b5b324afe", *v.Steps[0].ValueHex)
	assert.Equal(t, "bin\x1b[31m", v.Steps[0].Name)
}
