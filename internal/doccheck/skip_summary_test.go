package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// Every package whose tests can skip through internal/svctest (a test that
// needs a service, or a long exploration) runs them under svctest.Main or
// svctest.M, so that its skips end its output with the one line README.md's
// "Run it" promises; without it they pass unseen as "ok".
func TestServiceTestsEndWithTheSkipSummary(t *testing.T) {
	skips := regexp.MustCompile(`\bsvctest\.(Postgres|MySQL|Redis|RedisCluster|NATS|AMQP|Skipf|SkipUnlessLong)\(`)
	summary := regexp.MustCompile(`\bsvctest\.(Main|M)\(`)
	pkgs := map[string][2]bool{} // dir: {can skip, has the summary}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		if filepath.ToSlash(dir) == root+"/internal/svctest" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		p := pkgs[dir]
		p[0] = p[0] || skips.Match(b)
		p[1] = p[1] || summary.Match(b)
		pkgs[dir] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for dir, p := range pkgs {
		if p[0] && !p[1] {
			rel, _ := filepath.Rel(root, dir)
			missing = append(missing, "./"+filepath.ToSlash(rel))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("these packages' tests skip through svctest but have no TestMain calling svctest.Main (or svctest.M), so their skips print no summary line: %v", missing)
	}
}
