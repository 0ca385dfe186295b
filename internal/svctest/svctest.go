// Package svctest decides where a test finds the service it needs
// (PostgreSQL, MySQL/MariaDB, Redis, a Redis Cluster, NATS JetStream,
// RabbitMQ), what it does when there is none, and whether the long
// explorations run. It is the one home of these rules, so that a plain
// `go test ./...` runs every service test on a machine with the services
// at their standard local addresses, and says in one line per package what
// it skipped and why.
//
// The address of a service is, in order:
//
//   - the environment variable that names it (IDEM_POSTGRES_DSN,
//     IDEM_MYSQL_DSN, IDEM_REDIS_ADDR, IDEM_REDIS_CLUSTER_ADDRS,
//     IDEM_NATS_URL, IDEM_AMQP_URL), used as it is if something answers
//     at the host and port it names within a longer dial (3 s; a form
//     with no host and port, a Unix socket, is used without a dial);
//   - the variable set to the empty string turns that service off: its
//     tests skip;
//   - unset, the service's standard local address, if something answers
//     there within a short dial (200 ms); the variable is then set to it,
//     so that a child process the test starts finds it too. A Redis
//     Cluster has no standard address: unset, its tests skip.
//
// A test that cannot have its service skips with the reason on a
// developer's machine; in CI (the CI environment variable set to anything
// but empty or false, as CI services and .ci/run set it) it fails instead, since a skipped test
// there would pass without having run.
//
// The long explorations (idemtest.RunModel's budget, internal/multiproc's
// kill loop, internal/resume's kill points) run in full only with
// IDEM_LONG true (.ci/run sets it); the default run keeps a short version
// of each (Long, SkipUnlessLong), and runs the suites that mostly wait on
// the real clock side by side (AtOnceUnlessLong).
package svctest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// LongEnv is the one switch for the long explorations.
const LongEnv = "IDEM_LONG"

// dialTimeout is how long a standard local address has to answer before
// its service is taken for absent.
const dialTimeout = 200 * time.Millisecond

// namedDialTimeout is how long an address a variable names has to answer:
// longer, as the user asked for it and it may be across a network.
const namedDialTimeout = 3 * time.Second

// A service is one the tests may need: the variable that names it, its
// standard local address, and the address to dial to see that it is up.
type service struct {
	name string // for a reason: "PostgreSQL"
	env  string // the variable that names it
	def  string // the value used when env is unset; "" if it has none
	dial string // host:port to dial for def

	// addrs returns the host:port pairs a value of env names, to dial
	// before using it; none if its form has none (a Unix socket).
	addrs func(v string) []string

	once  sync.Once
	value string // the resolved value, or "" with why
	why   string // why there is none
}

// The services, with the variables and standard addresses README.md's
// "Run it" section lists (internal/doccheck checks that it does).
var (
	postgres = &service{name: "PostgreSQL", env: "IDEM_POSTGRES_DSN",
		def: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", dial: "127.0.0.1:5432",
		addrs: postgresHost}
	mysql = &service{name: "MySQL/MariaDB", env: "IDEM_MYSQL_DSN",
		def: "root@tcp(127.0.0.1:3306)/test", dial: "127.0.0.1:3306",
		addrs: mysqlHost}
	redis = &service{name: "Redis", env: "IDEM_REDIS_ADDR",
		def: "127.0.0.1:6379", dial: "127.0.0.1:6379",
		addrs: hostPort("6379")}
	redisCluster = &service{name: "Redis Cluster", env: "IDEM_REDIS_CLUSTER_ADDRS",
		addrs: hostPort("6379")}
	nats = &service{name: "NATS JetStream", env: "IDEM_NATS_URL",
		def: "nats://127.0.0.1:4222", dial: "127.0.0.1:4222",
		addrs: urlHost("4222")}
	amqp = &service{name: "RabbitMQ", env: "IDEM_AMQP_URL",
		def: "amqp://guest:guest@127.0.0.1:5672/", dial: "127.0.0.1:5672",
		addrs: amqpHost}
)

var all = []*service{postgres, mysql, redis, redisCluster, nats, amqp}

// Services lists every service, for a check that the docs name them all.
func Services() []struct{ Env, Default string } {
	var out []struct{ Env, Default string }
	for _, s := range all {
		out = append(out, struct{ Env, Default string }{s.env, s.def})
	}
	return out
}

// Postgres returns the DSN of the PostgreSQL server the tests use, or
// skips t (fails it in CI) when there is none.
func Postgres(t testing.TB) string { t.Helper(); return postgres.need(t) }

// MySQL returns the DSN (go-sql-driver/mysql's form) of the MySQL or
// MariaDB server the tests use, or skips t (fails it in CI).
func MySQL(t testing.TB) string { t.Helper(); return mysql.need(t) }

// Redis returns the host:port of the single Redis node the tests use, or
// skips t (fails it in CI).
func Redis(t testing.TB) string { t.Helper(); return redis.need(t) }

// RedisCluster returns the addresses of the Redis Cluster's nodes
// (IDEM_REDIS_CLUSTER_ADDRS, comma-separated; .ci/redis-cluster starts
// one), or skips t (fails it in CI).
func RedisCluster(t testing.TB) []string {
	t.Helper()
	return strings.Split(redisCluster.need(t), ",")
}

// NATS returns the URL of the NATS server, with JetStream, the tests use,
// or skips t (fails it in CI).
func NATS(t testing.TB) string { t.Helper(); return nats.need(t) }

// AMQP returns the URL of the RabbitMQ broker the tests use, or skips t
// (fails it in CI).
func AMQP(t testing.TB) string { t.Helper(); return amqp.need(t) }

// need returns the service's address, or skips t with why there is none.
func (s *service) need(t testing.TB) string {
	t.Helper()
	s.once.Do(s.resolve)
	if s.value == "" {
		Skipf(t, "%s", s.why)
	}
	return s.value
}

// resolve finds the service's address by the rules in the package doc.
func (s *service) resolve() {
	v, set := os.LookupEnv(s.env)
	switch {
	case set && v != "":
		// A named address where nothing answers (a typo, a stopped
		// container) is no service: say so once, rather than let each
		// test fail on a refused connection after its client's retries.
		if addrs := s.addrsOf(v); len(addrs) > 0 && !answers(addrs, namedDialTimeout) {
			s.why = fmt.Sprintf("no %s: nothing answers at %s (%s) within %v",
				s.name, strings.Join(addrs, ","), s.env, namedDialTimeout)
			return
		}
		s.value = v
	case set:
		s.why = fmt.Sprintf("no %s: %s is set empty, which turns it off", s.name, s.env)
	case s.def == "":
		s.why = fmt.Sprintf("no %s: %s is not set (it has no standard address)", s.name, s.env)
	default:
		if !answers([]string{s.dial}, dialTimeout) {
			s.why = fmt.Sprintf("no %s: nothing answers at its standard address %s within %v and %s is not set",
				s.name, s.dial, dialTimeout, s.env)
			return
		}
		s.value = s.def
		// A child process the test starts reads the variable.
		os.Setenv(s.env, s.def)
	}
}

// addrsOf returns the host:port pairs v names, none if s cannot read them.
func (s *service) addrsOf(v string) []string {
	if s.addrs == nil {
		return nil
	}
	return s.addrs(v)
}

// answers reports whether every one of addrs accepts a TCP connection
// within timeout.
func answers(addrs []string, timeout time.Duration) bool {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, timeout)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// hostPort reads a comma-separated list of host[:port] (a Redis node, a
// Cluster's nodes), port defaulting to port.
func hostPort(port string) func(string) []string {
	return func(v string) []string {
		var out []string
		for _, a := range strings.Split(v, ",") {
			out = append(out, withPort(strings.TrimSpace(a), port))
		}
		return out
	}
}

// urlHost reads a comma-separated list of URLs (NATS takes several),
// port defaulting to port.
func urlHost(port string) func(string) []string {
	return func(v string) []string {
		var out []string
		for _, a := range strings.Split(v, ",") {
			u, err := url.Parse(strings.TrimSpace(a))
			if err != nil || u.Host == "" {
				return nil // a form we cannot read: used without a dial
			}
			out = append(out, withPort(u.Host, port))
		}
		return out
	}
}

// amqpHost reads an AMQP URL: port 5672, or 5671 for amqps.
func amqpHost(v string) []string {
	if strings.HasPrefix(v, "amqps:") {
		return urlHost("5671")(v)
	}
	return urlHost("5672")(v)
}

// postgresHost reads a PostgreSQL URL or key=value DSN; a host that is a
// directory (a Unix socket) has no address to dial.
func postgresHost(v string) []string {
	if strings.Contains(v, "://") {
		return urlHost("5432")(v)
	}
	host, port := "localhost", "5432"
	for _, f := range strings.Fields(v) {
		if h, ok := strings.CutPrefix(f, "host="); ok {
			host = h
		} else if p, ok := strings.CutPrefix(f, "port="); ok {
			port = p
		}
	}
	if strings.HasPrefix(host, "/") {
		return nil
	}
	return []string{net.JoinHostPort(host, port)}
}

// mysqlHost reads go-sql-driver/mysql's DSN: the address in tcp(...);
// any other form (unix(...)) has none to dial.
func mysqlHost(v string) []string {
	_, rest, ok := strings.Cut(v, "@tcp(")
	if !ok {
		return nil
	}
	addr, _, ok := strings.Cut(rest, ")")
	if !ok || addr == "" {
		return nil
	}
	return []string{withPort(addr, "3306")}
}

// withPort returns addr with port added if it has none.
func withPort(addr, port string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), port)
}

// Skipf skips t with the reason the format gives, or fails t with it in
// CI: the CI environment variable set to anything but empty or false (as
// CI services and .ci/run set it).
// Main's summary counts the skip.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if inCI() {
		t.Fatalf("%s (CI is set: there a test that needs a service fails instead of skipping)", why)
	}
	skipped.add(why)
	t.Skip(why)
}

// Long reports whether the long explorations run in full: IDEM_LONG holds
// a true value ("1", "true", ...), as .ci/run sets it.
func Long() bool {
	long, _ := strconv.ParseBool(os.Getenv(LongEnv))
	return long
}

// SkipUnlessLong skips t, a long exploration whose short version runs
// elsewhere in the default run, unless Long. Main's summary counts the
// skip. It skips in CI too (CI without IDEM_LONG asked for the short run).
func SkipUnlessLong(t testing.TB, what string) {
	t.Helper()
	if Long() {
		return
	}
	why := fmt.Sprintf("long: %s runs with %s=1 (.ci/run sets it)", what, LongEnv)
	skipped.add(why)
	t.Skip(why)
}

// AtOnceUnlessLong runs t in parallel with the package's other parallel
// tests (t.Parallel) in a plain go test ./..., for a suite that mostly
// waits on the real clock; with IDEM_LONG (CI, under the race detector,
// with the long explorations beside it) t runs on its own, as it always
// did.
func AtOnceUnlessLong(t *testing.T) {
	t.Helper()
	if !Long() {
		t.Parallel()
	}
}

// inCI reports whether the tests run in CI: the CI environment variable
// is set to anything but empty or a false value ("false", "0"). Not every
// CI service sets a boolean (Woodpecker sets CI=woodpecker), and taking
// one of them for a developer's machine would let a test skip unseen.
func inCI() bool {
	v := os.Getenv("CI")
	if v == "" {
		return false
	}
	ci, err := strconv.ParseBool(v)
	return err != nil || ci
}

// Main runs the package's tests as M does and exits with their status: a
// package's TestMain is func TestMain(m *testing.M) { svctest.Main(m) }.
func Main(m *testing.M) { os.Exit(M(m).Run()) }

// M wraps m for a TestMain that hands it on (goleak.VerifyTestMain(
// svctest.M(m))): its Run finds every service's address first, so that
// code reading the variables directly (a child process, an example
// program) sees the standard address that answers, then runs the tests,
// then prints Summary.
func M(m *testing.M) interface{ Run() int } { return wrapped{m} }

type wrapped struct{ m *testing.M }

func (w wrapped) Run() int {
	for _, s := range all {
		s.once.Do(s.resolve)
	}
	code := w.m.Run()
	Summary()
	return code
}

// skipped counts the skips Skipf and SkipUnlessLong made, by reason.
var skipped = &skips{n: map[string]int{}}

type skips struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *skips) add(why string) {
	s.mu.Lock()
	s.n[why]++
	s.mu.Unlock()
}

// line is the summary: "" if nothing was skipped, else one line naming
// the package, how many tests were skipped, and each reason.
func (s *skips) line(pkg string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.n) == 0 {
		return ""
	}
	total := 0
	var reasons []string
	for why, n := range s.n {
		total += n
		reasons = append(reasons, fmt.Sprintf("%d: %s", n, why))
	}
	sort.Strings(reasons)
	tests := "tests"
	if total == 1 {
		tests = "test"
	}
	return fmt.Sprintf("svctest: %s: %d %s skipped (%s)", pkg, total, tests, strings.Join(reasons, "; "))
}

// Summary prints one line saying how many tests Skipf and SkipUnlessLong
// skipped and why, if they skipped any. It goes to standard output, and
// also to the terminal (/dev/tty) when the test binary's output is not
// shown: `go test ./...` prints only "ok" for a package that passed, so a
// skip would otherwise go unseen.
func Summary() {
	line := skipped.line(packageDir())
	if line == "" {
		return
	}
	fmt.Println(line)
	if testing.Verbose() || isTerminal(os.Stdout) {
		return // the line above is seen
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		fmt.Fprintln(tty, line)
		tty.Close()
	}
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// packageDir names the package under test by its directory relative to
// the module's root ("./postgres"): go test runs a test binary in its
// package's directory.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return wd
		}
		dir = parent
	}
}
