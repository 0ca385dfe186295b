package idemnats

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seed094d4201/idem"
)

// A progress marks one message InProgress at an interval, from the start
// of its handling until stop, or until the claim it follows loses its
// lease: the broker may then redeliver the message to whoever takes the
// key over.
type progress struct {
	once sync.Once
	done chan struct{} // closed by stop
	left chan struct{} // closed when the marking goroutine has returned
}

// progress starts marking msg, unless Options.ProgressInterval is
// negative.
func (c *Consumer[R]) progress(msg jetstream.Msg) *progress {
	p := &progress{done: make(chan struct{}), left: make(chan struct{})}
	every := c.opts.ProgressInterval
	if every < 0 {
		close(p.left)
		return p
	}
	go func() {
		defer close(p.left)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				// An error (the connection down) is not fatal: the
				// message may be redelivered, and the redelivery then
				// waits for this one's claim or replays its outcome.
				_ = msg.InProgress()
			}
		}
	}()
	return p
}

// stop ends the marks and waits until no more can be sent: a mark sent
// after the message's ack or nak would restart its AckWait for nothing.
func (p *progress) stop() {
	p.once.Do(func() { close(p.done) })
	<-p.left
}

// follow stops the marks when claim, the handler's context, ends with
// the lease lost; the returned func stops following.
func (p *progress) follow(claim context.Context) (unfollow func()) {
	stop := context.AfterFunc(claim, func() {
		if errors.Is(context.Cause(claim), idem.ErrLeaseLost) {
			p.once.Do(func() { close(p.done) })
		}
	})
	return func() { stop() }
}
