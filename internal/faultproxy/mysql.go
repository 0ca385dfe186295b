package faultproxy

// MySQLReplyDone reports whether reply, the bytes a MySQL or MariaDB
// server sent in answer to one command, starting at a packet boundary,
// holds the whole answer: an OK or ERR packet, or a result set through its
// terminator. Each packet is a 3-byte little-endian payload length, a
// sequence byte and the payload; a payload of 0xFFFFFF bytes continues in
// the next packet. A result set is a column count, that many column
// definitions, an EOF packet unless the client asked for
// CLIENT_DEPRECATE_EOF, the rows, and an EOF (or, deprecated, an OK
// packet with the 0xFE header) or an ERR.
func MySQLReplyDone(reply []byte) bool {
	packets := mysqlPackets(reply)
	if len(packets) == 0 {
		return false
	}
	first := packets[0]
	switch first[0] {
	case 0x00, 0xFF, 0xFB: // OK, ERR, LOCAL INFILE request: the whole answer
		return true
	}
	columns, ok := lenencInt(first)
	if !ok || columns == 0 {
		return false
	}
	i := 1 + int(min(columns, uint64(len(packets))))
	if i >= len(packets) {
		return false
	}
	if p := packets[i]; p[0] == 0xFE && len(p) == 5 { // the EOF after the definitions
		i++
	}
	for _, p := range packets[i:] {
		if p[0] == 0xFF || (p[0] == 0xFE && len(p) < 9) {
			return true
		}
	}
	return false
}

// mysqlPackets splits b into the payloads of its complete packets, joining
// those split at 0xFFFFFF bytes; a trailing partial packet is left out, and
// empty payloads are dropped (they end a split payload of exact length).
func mysqlPackets(b []byte) [][]byte {
	var packets [][]byte
	var joined []byte
	for len(b) >= 4 {
		n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
		if len(b) < 4+n {
			break
		}
		joined = append(joined, b[4:4+n]...)
		b = b[4+n:]
		if n == 0xFFFFFF {
			continue // more of this payload follows
		}
		if len(joined) > 0 {
			packets = append(packets, joined)
		}
		joined = nil
	}
	return packets
}

// lenencInt reads the length-encoded integer a payload starts with.
func lenencInt(p []byte) (uint64, bool) {
	size := map[byte]int{0xFC: 2, 0xFD: 3, 0xFE: 8}[p[0]]
	if p[0] < 0xFB {
		return uint64(p[0]), true
	}
	if size == 0 || len(p) < 1+size {
		return 0, false
	}
	var v uint64
	for i := size; i >= 1; i-- {
		v = v<<8 | uint64(p[i])
	}
	return v, true
}
