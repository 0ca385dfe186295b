package multiproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A child is a copy of this test binary running in one of its child modes
// (see TestMain), stopped at the point where it said "ready".
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser // the modes that wait read a line here before going on
}

// startChild runs this test binary with env added, and returns once the
// child has said "ready".
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not get ready: %q, %v", line, err)
	}
	return &child{cmd: cmd, in: in}
}

// goOn lets a waiting child go on.
func (c *child) goOn(t *testing.T) {
	t.Helper()
	_, err := io.WriteString(c.in, "go\n")
	require.NoError(t, err)
	require.NoError(t, c.in.Close())
}

// wait waits for the child to exit and requires that it succeeded.
func (c *child) wait(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Wait(), "a child process failed")
}

// kill stops the child with SIGKILL, as a crash would.
func (c *child) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	_ = c.cmd.Wait()
}
