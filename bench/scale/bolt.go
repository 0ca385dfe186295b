package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/bolt"
	bbolt "go.etcd.io/bbolt"
)

func init() {
	measurements["bolt"] = measureBolt
	children["bolt"] = boltChild
}

// measureBolt fills a bolt file, half of its keys with a TTL that lapses
// during the fill; times Open after a clean stop and after a SIGKILL; then
// sweeps the lapsed half while new keys are claimed.
func measureBolt(ctx context.Context, c config) error {
	path := filepath.Join(c.dir, "scale.db")
	b, err := bolt.Open(path, nil)
	if err != nil {
		return err
	}
	if err := fillHalves(ctx, b, c.keys); err != nil {
		b.Close()
		return err
	}
	if err := b.Close(); err != nil {
		return err
	}
	report("file after the fill", fileSize(path), c.keys)

	for _, stop := range []string{"clean", "clean", "SIGKILL", "SIGKILL"} {
		if stop == "SIGKILL" {
			if err := killChild("bolt", path); err != nil {
				return err
			}
		}
		start := time.Now()
		b, err := bolt.Open(path, nil)
		if err != nil {
			return err
		}
		fmt.Printf("open after a %s stop: %v (%d claims marked interrupted)\n", stop, time.Since(start).Round(time.Millisecond), b.Interrupted())
		if err := b.Close(); err != nil {
			return err
		}
	}

	b, err = bolt.Open(path, nil)
	if err != nil {
		return err
	}
	if err := sweepUnderLoad(ctx, b, func() int64 { return fileSize(path) }); err != nil {
		b.Close()
		return err
	}
	if err := b.Close(); err != nil {
		return err
	}

	// The package doc's remedy for a file a sweep left mostly free.
	start := time.Now()
	if err := compact(path); err != nil {
		return err
	}
	fmt.Printf("compaction: %v, the file now %d MB\n", time.Since(start).Round(time.Millisecond), fileSize(path)>>20)
	start = time.Now()
	b, err = bolt.Open(path, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Printf("open of the compacted copy (checked in full): %v\n", time.Since(start).Round(time.Millisecond))
	return newKeysFor(ctx, b, "new keys after compaction")
}

// compact rewrites the file at path as bbolt's compact command does.
func compact(path string) error {
	src, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := bbolt.Open(path+".compact", 0o600, nil)
	if err != nil {
		return err
	}
	if err := bbolt.Compact(dst, src, 64<<20); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Rename(path+".compact", path)
}

// held keeps the child's tickets reachable: a Ticket dropped unfinished
// is released by its finalizer, which would free its claim before the kill.
var held []*idem.Ticket[[]byte]

// boltChild opens the file, claims keys it never settles, says so on
// stdout, and waits to be killed.
func boltChild(path string) error {
	b, err := bolt.Open(path, nil)
	if err != nil {
		return err
	}
	s := idem.New[[]byte](idem.Options{Backend: b, SweepInterval: -1})
	for i := range 100 {
		t, err := s.Begin(context.Background(), fmt.Sprintf("held-%d-%d", os.Getpid(), i), nil)
		if err != nil {
			return err
		}
		held = append(held, t)
	}
	fmt.Println("ready")
	select {}
}

// killChild runs this program as a child that holds claims in path, and
// SIGKILLs it once they are written.
func killChild(backend, path string) error {
	cmd := exec.Command(os.Args[0], "-child", backend, "-dir", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("the child holding claims did not start: %q", line)
	}
	return nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
