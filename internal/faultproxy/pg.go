package faultproxy

import "encoding/binary"

// PostgresReadyForQuery reports whether reply, a stream of PostgreSQL backend
// messages starting at a message boundary, holds a complete ReadyForQuery
// ('Z') message. The server sends one when it has finished a request, so by
// then an implicit transaction has committed. Each message is one type byte
// and a big-endian int32 length that counts itself but not the type byte.
// A malformed length (below 4) is reported as not ready.
func PostgresReadyForQuery(reply []byte) bool {
	for len(reply) >= 5 {
		typ := reply[0]
		n := binary.BigEndian.Uint32(reply[1:5])
		if n < 4 || uint64(len(reply)-1) < uint64(n) {
			return false
		}
		if typ == 'Z' {
			return true
		}
		reply = reply[1+n:]
	}
	return false
}
