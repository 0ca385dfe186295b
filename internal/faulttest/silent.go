package faulttest

import (
	"net"
	"sync"
	"testing"
)

// SilentServer listens on 127.0.0.1, accepts every connection and never
// answers, as a database server that hangs does, and returns its address.
// It and its connections are closed on t.Cleanup.
func SilentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faulttest: listening: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn // guarded by mu; held open until cleanup
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
