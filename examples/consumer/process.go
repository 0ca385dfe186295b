package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A process is a worker started as a process of its own, so that it can
// be killed for real. lines carries what it says, line by line, and is
// closed when it exits.
type process struct {
	cmd   *exec.Cmd
	lines chan string
}

// A tally counts what the workers said, across their processes: the
// events acked, and how often each was settled.
type tally struct {
	mu      sync.Mutex
	acked   map[string]int // ID -> acks
	rejects int
	others  map[string]int // "reconciled true" and the like, by what was said
}

func newTally() *tally { return &tally{acked: map[string]int{}, others: map[string]int{}} }

func (t *tally) add(l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, what, ok := strings.Cut(l, " ")
	switch {
	case !ok:
	case what == "ack":
		t.acked[id]++
	case what == "reject":
		t.rejects++
	default:
		t.others[what]++
	}
}

// startWorker starts this program as a worker for b with the extra
// environment, and waits for it to say "ready".
func startWorker(exe, kind string, b broker, db string, t *tally, extra ...string) (*process, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), brokerEnv+"="+kind, urlEnv+"="+b.url(), queueEnv+"="+b.queue(), dbEnv+"="+db)
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, lines: make(chan string, 4096)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.add(sc.Text())
			select {
			case p.lines <- sc.Text():
			default: // nobody waits for it: the tally has it
			}
		}
	}()
	if _, err := p.waitFor(func(l string) bool { return l == "ready" }, 30*time.Second); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// waitFor reads lines until one satisfies ok, and returns it.
func (p *process) waitFor(ok func(string) bool, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, open := <-p.lines:
			if !open {
				return "", fmt.Errorf("the worker exited: %v", p.cmd.Wait())
			}
			if ok(l) {
				return l, nil
			}
		case <-t.C:
			return "", fmt.Errorf("the worker said nothing of the kind in %v", timeout)
		}
	}
}

// kill SIGKILLs the worker and reaps it.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}
