package main

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/seed094d4201/idem/backend"
	"github.com/seed094d4201/idem/bolt"
	"github.com/seed094d4201/idem/internal/svctest"
	"github.com/seed094d4201/idem/postgres"
)

// runCLI runs the command line args and returns its exit code, stdout and
// stderr.
func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb, time.Now().Add(time.Hour))
	return code, out.String(), errb.String()
}

// interruptedFile makes a bolt file with the given keys interrupted.
func interruptedFile(t *testing.T, keys ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	b, err := bolt.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, _, err := b.Claim(context.Background(), backend.Record{Key: k, Token: "dead", State: backend.StatePending}, time.Now(), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	return path
}

// shellWords splits line as /bin/sh does.
func shellWords(t *testing.T, line string) []string {
	out, err := exec.Command("sh", "-c", `for a in "$@"; do printf '%s\0' "$a"; done`, "sh", "-c", "true").Output()
	_ = out
	_ = err
	o, err := exec.Command("sh", "-c", "set -- "+line+`; for a in "$@"; do printf '%s\0' "$a"; done`).Output()
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Split(strings.TrimSuffix(string(o), "\x00"), "\x00")
	return w
}

// The next commands that show suggests must work when pasted into a shell,
// whatever the key.
func TestSuggestedCommandsRunWhenPasted(t *testing.T) {
	for _, key := range []string{"a b'c\"$HOME", "-k", "-json", "--", "-name=x"} {
		t.Run(key, func(t *testing.T) {
			path := interruptedFile(t, key)
			code, out, errs := runCLI("show", path, "--", key)
			if code != 0 {
				t.Fatalf("show %q: %d %s", key, code, errs)
			}
			var forget string
			for _, l := range strings.Split(out, "\n") {
				if i := strings.Index(l, "idem forget"); i >= 0 {
					forget = l[i:]
				}
			}
			words := shellWords(t, forget)
			code, _, errs = runCLI(words[1:]...)
			if code != 0 {
				t.Errorf("suggested %s -> exit %d: %s", forget, code, firstLine(errs))
			}
		})
	}
}

func firstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }

// `--` ends the flags for one argument only.
func TestDoubleDashEndsFlagsForOneArgument(t *testing.T) {
	path := interruptedFile(t, "-k")
	code, _, errs := runCLI("--", "show", path, "-k")
	t.Logf("idem -- show FILE -k: %d %s", code, firstLine(errs))
	if code == 2 {
		t.Errorf("after --, -k was parsed as a flag")
	}
}

// Exit codes.
func TestExitCodes(t *testing.T) {
	path := interruptedFile(t, "m3")
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"show", path, "nokey"}, 3},
		{[]string{"show", "-json", path, "nokey"}, 3},
		{[]string{"forget", path, "nokey"}, 3},
		{[]string{"resolve", path, "nokey", "-result", "1"}, 3},
		{[]string{"resolve", path, "m3", "-result", "{"}, 2},
		{[]string{"resolve", path, "m3", "-result", "1", "-error", "x"}, 2},
		{[]string{"show", path}, 2},
		{[]string{"-h"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"show", filepath.Join(t.TempDir(), "missing.db"), "k"}, 1},
		{[]string{"resolve", path, "m3", "-result", "1"}, 0},
		{[]string{"resolve", path, "m3", "-result", "1"}, 1},
	} {
		code, _, errs := runCLI(tc.args...)
		if code != tc.want {
			t.Errorf("%q: exit %d, want %d: %s", tc.args, code, tc.want, firstLine(errs))
		}
	}
}

// A read-only command on a file a service holds: fails fast, names the cause.
func TestReadOnlyCommandOnAHeldBoltFileFailsFast(t *testing.T) {
	path := interruptedFile(t, "m3")
	b, err := bolt.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	code, _, errs := runCLI("inspect", path)
	t.Logf("%d in %v: %s", code, time.Since(start), firstLine(errs))
	if code != 1 || time.Since(start) > 3*time.Second || !strings.Contains(errs, "running") {
		t.Errorf("inspect of a held file: %d %s", code, errs)
	}
}

// hang starts a TCP server that accepts and never answers.
func hang(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// -timeout bounds a hanging server, and no password is printed.
func TestTimeoutBoundsHangingServersAndHidesPasswords(t *testing.T) {
	addr := hang(t)
	for _, where := range []string{
		"postgres://u:hunter2@" + addr + "/db",
		"postgres://u@" + addr + "/db?password=hunter2",
		"redis://:hunter2@" + addr + "/0",
		"postgres://u:hun%zzter2@" + addr + "/db",
	} {
		start := time.Now()
		code, out, errs := runCLI("inspect", where, "-timeout", "700ms")
		took := time.Since(start)
		t.Logf("%s -> %d in %v: %s", where, code, took.Round(time.Millisecond), firstLine(errs))
		if took > 3*time.Second {
			t.Errorf("%s: -timeout 700ms took %v", where, took)
		}
		if strings.Contains(errs+out, "hunter2") || strings.Contains(errs+out, "hun%zzter2") {
			t.Errorf("password printed for %s: %s", where, firstLine(errs))
		}
	}
}

// resolve judges the lease by the shared backend's clock, not the
// operator's host clock: with a clock ahead of the server's, it does not
// resolve a key whose owner is alive and holds a live lease.
func TestResolveJudgesLeasesByTheServersClock(t *testing.T) {
	dsn := svctest.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table := "idem_rvcli_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	b, err := postgres.New(ctx, pool, postgres.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Claim(ctx, backend.Record{Key: "live", Token: "owner", State: backend.StatePending}, time.Now(), 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"resolve", dsn, "live", "-result", "1", "-name", table}, &out, &errb, time.Now().Add(15*time.Minute)) // operator's clock 15 min ahead
	rec, _, _ := b.Get(ctx, "live", time.Now())
	t.Logf("exit %d: %s%s; record now %v", code, out.String(), firstLine(errb.String()), rec.State)
	if code == 0 {
		t.Fatalf("resolved a key whose owner's lease holds by the server's clock (state was pending)")
	}
	// Forget under the same skew is refused by the server: the backend judges.
	code = run([]string{"forget", dsn, "live", "-name", table}, &out, &errb, time.Now().Add(15*time.Minute))
	t.Logf("forget under skew: %d", code)
}
