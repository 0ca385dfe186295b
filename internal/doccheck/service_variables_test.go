package doccheck

import (
	"regexp"
	"strings"
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
)

// README.md says where a test finds its service, and when it skips, in one
// place, "Run it", which internal/svctest's rules are checked against
// (TestTestVariablesAgreeWithTheCode): another paragraph naming a service
// variable says nothing of when its tests skip, so it cannot state a rule
// the code has since changed.
func TestOnlyRunItSaysWhenServiceTestsSkip(t *testing.T) {
	readme := read(t, "README.md")
	run := section(t, "## Run it")
	rest := strings.Replace(readme, run, "", 1)
	rule := regexp.MustCompile(`(?i)\bskip|\bunset\b`)
	for _, para := range strings.Split(rest, "\n\n") {
		for _, s := range serviceVariables() {
			if strings.Contains(para, s) && rule.MatchString(para) {
				t.Errorf("README.md names %s and says when tests skip outside Run it, which says it for every service: %q", s, strings.Join(strings.Fields(para), " "))
				break
			}
		}
	}
}

// serviceVariables are the variables internal/svctest reads for a service.
func serviceVariables() []string {
	var out []string
	for _, s := range svctest.Services() {
		out = append(out, s.Env)
	}
	return out
}
