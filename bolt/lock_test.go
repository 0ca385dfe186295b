package bolt

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/seed094d4201/idem/backend"
	"github.com/stretchr/testify/require"
)

// An Open that waits for a live writer's lock does not check the file
// while that writer commits: its check runs under the lock, so a sound
// file is never called corrupt. (Checked outside the lock, 2 Opens in 20
// failed with "page 14: bucket element 1 too short" or
// "freelist page 10: type 0x2", read mid-commit.)
func TestOpenWaitingForAWriterChecksASoundFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	ctx := context.Background()
	for round := range 20 {
		a, err := Open(path, &Options{noSync: true})
		require.NoError(t, err)
		commits := make(chan int, 1)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case commits <- i:
				default:
				}
				rec := backend.Record{Key: fmt.Sprintf("r%d-%06d", round, i), Token: "t", State: backend.StatePending}
				if _, _, err := a.Claim(ctx, rec, time.Now(), 0); err != nil {
					return
				}
				rec.Value = make([]byte, 300)
				_ = a.Complete(ctx, rec, time.Now(), time.Millisecond)
				if i%50 == 0 {
					_, _ = a.Sweep(ctx, time.Now().Add(time.Second), 1000)
				}
			}
		}()
		for n := range commits { // let the writer fill the file a little
			if n >= 100 {
				break
			}
		}
		opened := make(chan error, 1)
		go func() {
			b, err := Open(path, &Options{LockTimeout: 10 * time.Second})
			if err == nil {
				err = b.Close()
			}
			opened <- err
		}()
		for n := range commits { // and write on while the second Open waits
			if n >= 300 {
				break
			}
		}
		close(stop)
		<-done
		require.NoError(t, a.Close())
		require.NoError(t, <-opened, "round %d: an Open that waited for the writer", round)
	}
}
