package idemgrpc

import (
	"strings"

	"google.golang.org/grpc/metadata"
)

// neverStored are the metadata keys never remembered nor replayed, whatever
// the options: credentials, which belong to one caller and would hand it to
// every retry; the HTTP/2 connection headers and the ones gRPC makes for
// each response (with the pseudo-headers and grpc- keys, see neverKept),
// which describe one transmission, not the outcome; and this package's own
// marks, which a replay sets afresh.
var neverStored = map[string]bool{
	"set-cookie": true, "cookie": true, "authorization": true, "proxy-authorization": true,
	"www-authenticate": true, "proxy-authenticate": true, "authentication-info": true, "proxy-authentication-info": true,
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true, "trailer": true,
	"transfer-encoding": true, "upgrade": true, "content-type": true, "content-length": true, "user-agent": true,
	ReplayedHeader: true, BodyOmittedHeader: true,
}

// neverKept reports whether the lowercase key is one no option can keep:
// those in neverStored, the pseudo-headers (":status") and every key gRPC
// reserves (grpc-status, grpc-message, ... and grpc-retry-pushback-ms, which
// a handler sets through metadata but which speaks of one attempt).
func neverKept(key string) bool {
	return neverStored[key] || strings.HasPrefix(key, ":") || strings.HasPrefix(key, "grpc-")
}

// A metadataPolicy says which header and trailer keys are remembered.
type metadataPolicy struct {
	only map[string]bool // nil: every key but the skipped ones
	skip map[string]bool
}

func newMetadataPolicy(only, skip []string) metadataPolicy {
	set := func(keys []string) map[string]bool {
		if keys == nil {
			return nil
		}
		m := make(map[string]bool, len(keys))
		for _, k := range keys {
			m[strings.ToLower(k)] = true
		}
		return m
	}
	return metadataPolicy{only: set(only), skip: set(skip)}
}

// keeps reports whether the lowercase key is remembered.
func (p metadataPolicy) keeps(key string) bool {
	if neverKept(key) || p.skip[key] {
		return false
	}
	return p.only == nil || p.only[key]
}

// filter returns a copy of the part of md that is remembered, its keys in
// lowercase as gRPC sends them, or nil if none is. Keys are compared
// without regard to case: metadata.Pairs lowercases them, but an MD built
// by hand need not.
func (p metadataPolicy) filter(md metadata.MD) metadata.MD {
	var out metadata.MD
	for k, vs := range md {
		k = strings.ToLower(k)
		if len(vs) == 0 || !p.keeps(k) {
			continue
		}
		if out == nil {
			out = make(metadata.MD, len(md))
		}
		out[k] = append(out[k], vs...)
	}
	return out
}
