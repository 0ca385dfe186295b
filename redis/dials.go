package redis

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A dialWatch is a hook on the backend's client that remembers how its
// latest dial ended, so that a call whose ctx ends while go-redis is still
// retrying refused dials can say the server is unreachable, rather than
// only that ctx ended, which the Store would take for a claim that may
// have landed. go-redis reports ctx's error in that case and drops the
// dial's.
type dialWatch struct {
	mu  sync.Mutex
	at  time.Time // guarded by mu; when the latest dial that ran its course ended
	err error     // guarded by mu; its error, nil if it connected
}

var _ redis.Hook = (*dialWatch)(nil)

func (w *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err == nil || ctx.Err() == nil { // a dial cut short by ctx tells nothing of the server
			w.mu.Lock()
			w.at, w.err = time.Now(), err
			w.mu.Unlock()
		}
		return conn, err
	}
}

func (w *dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (w *dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// failedSince returns the latest dial's error if it ended after start and
// failed: the server could not be reached while the call was waiting.
func (w *dialWatch) failedSince(start time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil && !w.at.Before(start) {
		return w.err
	}
	return nil
}
