package bolt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// The crash tests re-execute this test binary as a child process that claims
// a key through a bolt-backed Store and stops at a chosen point; the parent
// kills it with SIGKILL there, as a crash would.
const (
	crashChildEnv = "IDEM_BOLT_CRASH_CHILD" // where the child stops: "in-fn" or "before-complete"
	crashFileEnv  = "IDEM_BOLT_CRASH_FILE"
	crashReady    = "ready"
)

// crashChild runs in the child process: it claims key "k", tells the parent
// it has reached its stopping point, and waits there to be killed.
func crashChild() {
	stopAt, path := os.Getenv(crashChildEnv), os.Getenv(crashFileEnv)
	b, err := Open(path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	stop := func() {
		fmt.Println(crashReady)
		select {} // until SIGKILL
	}
	if stopAt == "before-complete" {
		testHookBeforeComplete = stop
	}
	s := idem.New[string](idem.Options{Backend: b})
	if stopAt == "in-tx" { // inside RunOnceTx, after fn's write
		err := b.Update(context.Background(), func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(moves)
			return err
		})
		if err == nil {
			_, err = RunOnceTx(context.Background(), s, "k", "charge order 101", func(ctx context.Context, tx *bbolt.Tx) (string, error) {
				if err := tx.Bucket(moves).Put([]byte("k"), []byte("charged")); err != nil {
					return "", err
				}
				stop()
				return "charged", nil
			})
		}
		fmt.Fprintln(os.Stderr, "child: not killed in RunOnceTx, err:", err)
		os.Exit(3)
	}
	_, err = s.RunOnce(context.Background(), "k", "charge order 101", func(context.Context) (string, error) {
		if stopAt == "in-fn" {
			stop()
		}
		return "charged", nil
	})
	fmt.Fprintln(os.Stderr, "child: not killed at", stopAt, "err:", err)
	os.Exit(3)
}

// crashAt runs a child that stops at stopAt with the database at path, and
// kills it there with SIGKILL.
func crashAt(t *testing.T, path, stopAt string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+stopAt, crashFileEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != crashReady+"\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not reach %s: %q, %v", stopAt, line, err)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "child: %v", err)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
}

func TestCrashLeavesKeyInterrupted(t *testing.T) {
	for _, stopAt := range []string{"in-fn", "before-complete"} {
		t.Run(stopAt, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "idem.db")
			crashAt(t, path, stopAt)

			b, err := Open(path, nil)
			require.NoError(t, err, "reopening after a crash")
			defer b.Close()
			assert.Equal(t, 1, b.Interrupted())
			s := idem.New[string](idem.Options{Backend: b})
			defer s.Close()
			var calls atomic.Int32
			fn := func(context.Context) (string, error) {
				calls.Add(1)
				return "charged again", nil
			}
			ctx := context.Background()
			_, err = s.RunOnce(ctx, "k", "charge order 101", fn)
			assert.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			assert.Zero(t, calls.Load(), "a key claimed before a crash must not run again on its own")

			require.NoError(t, s.Forget(ctx, "k"))
			v, err := s.RunOnce(ctx, "k", "charge order 101", fn)
			require.NoError(t, err)
			assert.Equal(t, "charged again", v)
			assert.Equal(t, int32(1), calls.Load())
		})
	}
}

func TestCrashWithRetryInterruptedRunsOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	crashAt(t, path, "in-fn")
	b, err := Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	s := idem.New[string](idem.Options{Backend: b, RetryInterrupted: true})
	defer s.Close()
	var calls atomic.Int32
	fn := func(context.Context) (string, error) { calls.Add(1); return "charged", nil }
	for range 3 {
		v, err := s.RunOnce(context.Background(), "k", "charge order 101", fn)
		require.NoError(t, err)
		assert.Equal(t, "charged", v)
	}
	assert.Equal(t, int32(1), calls.Load())
}

// A process killed inside RunOnceTx, after fn wrote, leaves neither the
// write nor the key: the key is free, not interrupted, and the next call
// runs.
func TestCrashInsideRunOnceTxLeavesNeither(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	crashAt(t, path, "in-tx")
	b, err := Open(path, nil)
	require.NoError(t, err)
	defer b.Close()
	assert.Zero(t, b.Interrupted(), "no claim was on disk")
	_, found, err := b.Get(context.Background(), "k", time.Now())
	require.NoError(t, err)
	assert.False(t, found, "the key is free")
	require.NoError(t, b.View(context.Background(), func(tx *bbolt.Tx) error {
		assert.Nil(t, tx.Bucket(moves).Get([]byte("k")), "fn's write is gone")
		return nil
	}))
	s := idem.New[string](idem.Options{Backend: b})
	defer s.Close()
	v, err := RunOnceTx(context.Background(), s, "k", "charge order 101", func(ctx context.Context, tx *bbolt.Tx) (string, error) {
		return "charged", tx.Bucket(moves).Put([]byte("k"), []byte("charged"))
	})
	require.NoError(t, err)
	assert.Equal(t, "charged", v)
}
