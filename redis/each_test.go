package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A prefix holding SCAN's pattern characters lists its own records only:
// "p[1]:" read as a pattern would match "p1:", and "p*:" every "p…:".
func TestEachTakesThePrefixLiterally(t *testing.T) {
	rdb := testClient(t)
	ctx := context.Background()
	var r [6]byte
	_, _ = rand.Read(r[:])
	base := "idemtest:" + hex.EncodeToString(r[:])
	t.Cleanup(func() {
		iter := rdb.Scan(ctx, 0, base+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	prefixes := []string{base + "1:", base + "[1]:", base + "*:", base + "?:", base + `\:`, base + "[^x]:"}
	for _, p := range prefixes {
		b := New(rdb, Options{Prefix: p})
		_, won, err := b.Claim(ctx, backend.Record{Key: "of " + p, Token: "t"}, time.Time{}, time.Minute)
		require.NoError(t, err)
		require.True(t, won)
	}
	for _, p := range prefixes {
		var keys []string
		require.NoError(t, New(rdb, Options{Prefix: p}).Each(ctx, func(rec backend.Record) error {
			keys = append(keys, rec.Key)
			return nil
		}))
		assert.Equal(t, []string{"of " + p}, keys, "the listing of prefix %q", p)
	}
}
