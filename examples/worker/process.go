package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// The worker runs as a process of its own, so that it can be killed for
// real: this program started again with workerEnv set to "kind:path". It
// opens the stock, says "ready", then applies the events it reads on stdin,
// one per line ("ID ITEM DELTA"), and answers each on stdout:
// "applied ID LEFT", "skipped ID LEFT" or "failed ID ERROR". The broker
// (the parent) acks an event when its answer arrives.
const (
	workerEnv = "IDEM_EXAMPLE_WORKER"
	// crashEnv names an event: the worker stops inside that event's
	// transaction, after its stock change, says "inside ID", and waits
	// there to be killed.
	crashEnv = "IDEM_EXAMPLE_WORKER_CRASH"
)

// serveWorker is the worker process's main loop.
func serveWorker(spec string, in io.Reader, out io.Writer) error {
	kind, path, ok := strings.Cut(spec, ":")
	if !ok {
		return fmt.Errorf("%s=%q: want kind:path", workerEnv, spec)
	}
	var inside func(Event)
	if id := os.Getenv(crashEnv); id != "" {
		inside = func(e Event) {
			if e.ID == id {
				fmt.Fprintln(out, "inside", e.ID)
				select {} // until SIGKILL
			}
		}
	}
	stock, err := openStock(kind, path, inside)
	if err != nil {
		return err
	}
	defer stock.Close()
	fmt.Fprintln(out, "ready")
	ctx := context.Background()
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		e, err := parseEvent(lines.Text())
		if err != nil {
			return err
		}
		left, applied, err := stock.Apply(ctx, e)
		switch {
		case err != nil:
			fmt.Fprintln(out, "failed", e.ID, err)
		case applied:
			fmt.Fprintln(out, "applied", e.ID, left)
		default:
			fmt.Fprintln(out, "skipped", e.ID, left)
		}
	}
	return lines.Err()
}

func (e Event) String() string { return fmt.Sprintf("%s %s %d", e.ID, e.Item, e.Delta) }

func parseEvent(line string) (Event, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return Event{}, fmt.Errorf("event %q: want ID ITEM DELTA", line)
	}
	delta, err := strconv.Atoi(f[2])
	if err != nil {
		return Event{}, fmt.Errorf("event %q: %w", line, err)
	}
	return Event{ID: f[0], Item: f[1], Delta: delta}, nil
}

// A worker is the worker process as the broker sees it.
type worker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// errWorkerGone is returned by deliver when the worker died before it
// answered: the event stays unacked, and the broker hands it out again.
var errWorkerGone = errors.New("the worker is gone")

// startWorker starts the worker process on the stock of kind at path, with
// env added, and returns once it is ready.
func startWorker(kind, path string, env ...string) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$") // the flag is for the test binary, which runs this too
	cmd.Env = append(os.Environ(), append(env, workerEnv+"="+kind+":"+path)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if line, err := w.out.ReadString('\n'); err != nil || line != "ready\n" {
		_ = w.kill()
		return nil, fmt.Errorf("the worker did not start: %q, %v", line, err)
	}
	return w, nil
}

// deliver hands e to the worker and returns its answer's words, or
// errWorkerGone.
func (w *worker) deliver(e Event) ([]string, error) {
	if _, err := fmt.Fprintln(w.in, e); err != nil {
		return nil, errWorkerGone
	}
	line, err := w.out.ReadString('\n')
	if err != nil {
		return nil, errWorkerGone
	}
	return strings.Fields(line), nil
}

// kill stops the worker with SIGKILL, as a crash or an OOM kill would.
func (w *worker) kill() error {
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	_ = w.cmd.Wait() // "signal: killed"
	return nil
}

// stop ends the worker's input and waits for it to exit.
func (w *worker) stop() error {
	_ = w.in.Close()
	return w.cmd.Wait()
}
