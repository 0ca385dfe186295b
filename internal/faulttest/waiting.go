package faulttest

import (
	"bytes"
	"context"
	"sync"
)

// Waiting is a context that tells, by closing Asked, when its Done
// channel is first asked for: a duplicate call asks for it as it starts to
// wait for the key in flight, so a test knows the duplicate waits before
// it lets the first call end.
type Waiting struct {
	context.Context
	once  sync.Once
	Asked chan struct{}
}

// NewWaiting returns a Waiting over parent.
func NewWaiting(parent context.Context) *Waiting {
	return &Waiting{Context: parent, Asked: make(chan struct{})}
}

func (c *Waiting) Done() <-chan struct{} {
	c.once.Do(func() { close(c.Asked) })
	return c.Context.Done()
}

// LogBuffer is a bytes.Buffer a logger may write from many goroutines.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
