package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/seed094d4201/idem/internal/svctest"
)

// root is the module's root, from this package's directory.
const root = "../.."

// backendPackages are the module's packages whose type Backend has the
// method named (Claim: a backend; RecordStep: it records steps, a
// backend.Stepper; Each: it lists its records, a backend.Lister), or, with
// method "RunOnceTx", those with a func RunOnceTx. Read from the code, so
// that a new backend, or one that gains steps, is a list the docs must
// follow.
func backendPackages(t *testing.T, method string) []string {
	t.Helper()
	dirs, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range dirs {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		paths, err := filepath.Glob(filepath.Join(root, d.Name(), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		var files []*ast.File
		for _, path := range paths {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		if has(files, method) {
			names = append(names, d.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatalf("no package has %s: the scan is broken", method)
	}
	return names
}

// has reports whether files declare a method named method on a type named
// Backend, or, for "RunOnceTx", a func of that name.
func has(files []*ast.File, method string) bool {
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Name.Name != method {
				continue
			}
			if method == "RunOnceTx" {
				if fn.Recv == nil {
					return true
				}
				continue
			}
			if fn.Recv != nil && len(fn.Recv.List) == 1 && receiverType(fn.Recv.List[0].Type) == "Backend" {
				return true
			}
		}
	}
	return false
}

func receiverType(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch g := e.(type) { // a generic type: Store[R]
	case *ast.IndexExpr:
		e = g.X
	case *ast.IndexListExpr:
		e = g.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// cliSchemes are the targets the idem command opens by their prefix, the
// first of each case of openTarget's switch (postgres://, mysql://, ...),
// and sqlite:.
func cliSchemes(t *testing.T) []string {
	src := read(t, "cmd/idem/open.go")
	var out []string
	for _, line := range strings.Split(src, "\n") {
		if m := regexp.MustCompile(`^\s*case strings\.HasPrefix\(where, "([a-z]+://)"\)`).FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	if strings.Contains(src, `strings.CutPrefix(where, "sqlite:")`) {
		out = append(out, "sqlite:")
	}
	if len(out) < 2 {
		t.Fatalf("openTarget's schemes not found in cmd/idem/open.go: %v", out)
	}
	return out
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goDoc returns the doc comment of name in the Go file at path: the
// package doc for "package", a type's or a func's, or a struct field's as
// "Type.Field".
func goDoc(t *testing.T, path, name string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, path), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	if name == "package" {
		return f.Doc.Text()
	}
	typ, field, _ := strings.Cut(name, ".")
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name == name {
				return d.Doc.Text()
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok || ts.Name.Name != typ {
					continue
				}
				if field == "" {
					return d.Doc.Text() + ts.Doc.Text()
				}
				if st, ok := ts.Type.(*ast.StructType); ok {
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							if n.Name == field {
								return fl.Doc.Text()
							}
						}
					}
				}
			}
		}
	}
	t.Fatalf("%s: no doc for %s", path, name)
	return ""
}

// methodDoc returns the doc comment of the func or method called name in
// the Go file at path.
func methodDoc(t *testing.T, path, name string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, path), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, decl := range f.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == name {
			return fn.Doc.Text()
		}
	}
	t.Fatalf("%s: no func %s", path, name)
	return ""
}

// readmePart returns the paragraph, or list item, of README.md that holds
// marker.
func readmePart(t *testing.T, marker string) string {
	t.Helper()
	return part(t, "README.md", read(t, "README.md"), marker)
}

func part(t *testing.T, where, text, marker string) string {
	t.Helper()
	for _, para := range strings.Split(text, "\n\n") {
		for _, item := range strings.Split(para, "\n- ") {
			if strings.Contains(item, marker) {
				return item
			}
		}
	}
	t.Fatalf("%s: nothing holds %q", where, marker)
	return ""
}

// section returns README.md's section under heading.
func section(t *testing.T, heading string) string {
	t.Helper()
	readme := read(t, "README.md")
	_, after, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q", heading)
	}
	if i := strings.Index(after, "\n## "); i >= 0 {
		after = after[:i]
	}
	return after
}

// names checks that text, which where says is, names every one of want
// as a word, and no other of all (a backend the list must not name).
func names(t *testing.T, where, text string, want, all []string) {
	t.Helper()
	text = strings.Join(strings.Fields(text), " ")
	for _, n := range all {
		word := `(^|[^\w])` + regexp.QuoteMeta(n)
		if n[len(n)-1] != ':' && n[len(n)-1] != '/' { // a scheme is followed by its rest
			word += `($|[^\w])`
		}
		in := regexp.MustCompile(word).MatchString(text)
		wanted := contains(want, n)
		switch {
		case wanted && !in:
			t.Errorf("%s does not name %s, which the code has (%v): %q", where, n, want, text)
		case !wanted && in:
			t.Errorf("%s names %s, which the code does not have (%v): %q", where, n, want, text)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestBackendListsAgreeWithTheCode(t *testing.T) {
	backends := backendPackages(t, "Claim")
	steppers := backendPackages(t, "RecordStep")
	listers := backendPackages(t, "Each")
	tx := backendPackages(t, "RunOnceTx")
	t.Logf("backends %v; steps %v; lists %v; RunOnceTx %v", backends, steppers, listers, tx)

	durability := part(t, "doc.go", goDoc(t, "doc.go", "package"), "With Options.Backend set")
	names(t, "the root package doc (# Durability)", durability, backends, backends)
	names(t, "Options.Backend", goDoc(t, "options.go", "Options.Backend"), backends, backends)
	names(t, "Options.Resume", goDoc(t, "options.go", "Options.Resume"), steppers, backends)
	names(t, "idem.Step", part(t, "step.go", goDoc(t, "step.go", "Step"), "backend.Stepper"), steppers, backends)
	names(t, "backend.Stepper", goDoc(t, "backend/step.go", "Stepper"), steppers, backends)
	names(t, "backend.Lister", goDoc(t, "backend/backend.go", "Lister"), listers, backends)
	names(t, "internal/txrun's package doc", goDoc(t, "internal/txrun/txrun.go", "package"), tx, backends)

	names(t, "README.md's RunOnceTx for queue handlers", readmePart(t, "commits its writes with the key ("), tx, tx)
	names(t, "idemqueue.Consumer.HandleTx", part(t, "idemqueue", methodDoc(t, "idemqueue/consumer.go", "HandleTx"), "RunOnceTx of"), tx, backends)
	names(t, "idemqueue.Consumer.Decide", part(t, "idemqueue", methodDoc(t, "idemqueue/consumer.go", "Decide"), "RunOnceTx of"), tx, backends)
	names(t, "idemnats's HandleTx", part(t, "idemnats", methodDoc(t, "idemqueue/idemnats/consumer.go", "HandleTx"), "RunOnceTx of"), tx, backends)
	names(t, "idemrabbit's RunTx", part(t, "idemrabbit", methodDoc(t, "idemqueue/idemrabbit/run.go", "RunTx"), "RunOnceTx of"), tx, backends)

	names(t, "README.md's list of step backends", readmePart(t, "**Backends.** Steps need"), steppers, backends)
	names(t, "README.md's Resume example", readmePart(t, "Resume: true}) // b:"), steppers, backends)
	names(t, "README.md's backends that list interrupted keys", readmePart(t, "lists the keys a dead owner left interrupted"), listers, backends)
}

func TestCLITargetListsAgreeWithTheCode(t *testing.T) {
	schemes := cliSchemes(t)
	all := append([]string{"rediss://", "postgresql://"}, schemes...) // aliases: naming one is no fault
	names(t, "README.md's idem targets", readmePart(t, "WHERE is a bolt file"), schemes, schemes)
	names(t, "README.md's idem targets for shared backends", readmePart(t, "The same commands take a"), without(schemes, "sqlite:"), schemes)
	usage := read(t, "cmd/idem/main.go")
	names(t, "idem help's targets", part(t, "cmd/idem/main.go", usage, "WHERE is a bolt file"), schemes, all)
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// README.md's "Run it" names every variable the tests read for a
// service, with its standard local address, and the one switch for the
// long explorations, which .ci/run sets.
func TestTestVariablesAgreeWithTheCode(t *testing.T) {
	run := section(t, "## Run it")
	for _, s := range svctest.Services() {
		if !strings.Contains(run, s.Env) {
			t.Errorf("README.md's Run it does not name %s, which internal/svctest reads", s.Env)
		}
		if s.Default != "" && !strings.Contains(run, s.Default) {
			t.Errorf("README.md's Run it does not give %s's standard address %s", s.Env, s.Default)
		}
	}
	if !strings.Contains(run, svctest.LongEnv) {
		t.Errorf("README.md's Run it does not name %s, the switch for the long explorations", svctest.LongEnv)
	}
	if ci := read(t, ".ci/run"); !strings.Contains(ci, "export "+svctest.LongEnv+"=1") {
		t.Errorf(".ci/run does not set %s=1: CI would run only the short versions", svctest.LongEnv)
	}
}

// A public doc comment (a package's, or an exported name's, in a package a
// user can import) explains in the user's words: it names no internal
// package, and no article outside this repository.
func TestPublicDocsNameNoInternals(t *testing.T) {
	banned := regexp.MustCompile(`seed article|charge_once|\btxrun\b|\bseam\b|internal/`)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "internal" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for name, doc := range publicDocs(f) {
			if m := banned.FindString(doc); m != "" {
				t.Errorf("%s: the doc of %s names %q, which its reader cannot see: %q", path, name, m, strings.Join(strings.Fields(doc), " "))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// publicDocs returns the doc comments go doc shows for f: the package's,
// and each exported name's (with its exported fields and methods).
func publicDocs(f *ast.File) map[string]string {
	docs := map[string]string{"package " + f.Name.Name: f.Doc.Text()}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() && (d.Recv == nil || ast.IsExported(receiverType(d.Recv.List[0].Type))) {
				docs[d.Name.Name] = d.Doc.Text()
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					docs[s.Name.Name] = d.Doc.Text() + s.Doc.Text()
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								if n.IsExported() {
									docs[s.Name.Name+"."+n.Name] = fl.Doc.Text()
								}
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							docs[n.Name] = d.Doc.Text() + s.Doc.Text()
						}
					}
				}
			}
		}
	}
	return docs
}

// TestReadmePerformanceFiguresAreInTheBenchmarks: every number the README's
// "Performance" section states is one bench/README.md states beside the
// command that made it, so that a figure measured again cannot leave the
// README behind.
func TestReadmePerformanceFiguresAreInTheBenchmarks(t *testing.T) {
	readme := read(t, "README.md")
	start := strings.Index(readme, "\n## Performance\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Performance" section`)
	}
	section := readme[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	bench := read(t, "bench/README.md")
	figures := regexp.MustCompile(`\d[\d,]*(\.\d+)?`).FindAllString(section, -1)
	if len(figures) < 10 {
		t.Fatalf("only %d figures in the README's Performance section: %q", len(figures), figures)
	}
	for _, f := range figures {
		if !regexp.MustCompile(`(^|[^\d.,])` + regexp.QuoteMeta(f) + `($|[^\d,]|\.[^\d])`).MatchString(bench) {
			t.Errorf("the README's Performance section states %s, which bench/README.md does not", f)
		}
	}
}
