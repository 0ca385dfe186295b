package sqlite

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/stretchr/testify/require"
)

// The tests that need other processes re-execute this test binary with
// childEnv naming one of childModes; the mode says "ready" on stdout when
// it reaches the point where the parent acts (kills it, or goes on).
const childEnv = "IDEM_SQLITE_CHILD"

// childModes are the child processes' programs, by name; files add theirs
// in init. A mode that returns has failed or finished.
var childModes = map[string]func() error{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		run, ok := childModes[mode]
		if !ok {
			fmt.Fprintln(os.Stderr, "child: unknown mode", mode)
			os.Exit(2)
		}
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", mode+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// svctest.M: the run ends with one line saying what was skipped and
	// why (a tmpfs that could not be mounted, say).
	os.Exit(svctest.M(m).Run())
}

// startChild runs this test binary in mode with env added, returns once it
// said "ready", and kills it when the test ends if it is still running.
func startChild(t *testing.T, mode string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, childEnv+"="+mode)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child %s did not get ready: %q, %v", mode, line, err)
	}
	return cmd
}

// sigkill stops the child as a crash would, and waits for it.
func sigkill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
}
