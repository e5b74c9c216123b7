package deploycheck_test

// What the Kubernetes checks need to know about gpuproxy, read from the
// product's own source rather than restated here, so that a change there
// (a route renamed, a longer shutdown, a new setting) fails these checks
// instead of leaving the manifests quietly wrong.
//
// The route table is read by parsing server/routes.go with go/parser: it
// is the one file that registers every route (STYLE.md, "lists every route
// in one routes.go"), and the probes need three facts it shows directly —
// the path is registered on the root router (no authentication: a probe
// sends no credentials), for GET, and unconditionally (not inside an if,
// as /metrics is). Importing the product instead would pull its whole
// dependency graph into this module, whose point is to stay apart, and
// building the server needs a database; a list written by a product test
// would be one more file to keep fresh.

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sourceFiles are the product files the facts come from, relative to the
// module root; every non-test .go file of cmd/gpuproxy is read too.
var sourceFiles = []string{"server/routes.go", "server/handlers.go", "app/config.go", "db/db.go", dockerfileName}

// configPkg is where the configuration types, the environment overrides
// and the commands live.
const configPkg = "cmd/gpuproxy"

// readSources reads the files the facts come from.
func readSources(root string) (map[string]string, error) {
	src := map[string]string{}
	names := slices.Clone(sourceFiles)
	entries, err := os.ReadDir(filepath.Join(root, configPkg))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			names = append(names, configPkg+"/"+n)
		}
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, n))
		if err != nil {
			return nil, err
		}
		src[n] = string(b)
	}
	return src, nil
}

// configKeys is the tree of gpuproxy.yaml's keys; a nil value is a leaf
// (any value).
type configKeys map[string]*configNode

// configNode is one key: a leaf, a mapping (keys) or a list of mappings.
type configNode struct {
	keys configKeys
	list bool
}

// sourceFacts is what the checks know about the product.
type sourceFacts struct {
	// rootGETs are the paths registered for GET on the root router,
	// mapped to whether that registration is unconditional.
	rootGETs map[string]bool
	// readyTimeout is how long /ready waits for its checks.
	readyTimeout time.Duration
	// shutdownTimeout bounds finishing in-flight requests on SIGTERM,
	// closeTimeout the flush that follows.
	shutdownTimeout, closeTimeout time.Duration
	// config are gpuproxy.yaml's keys; envNames the environment
	// variables that override them.
	config   configKeys
	envNames map[string]bool
	// defaultListen is the address serve listens on unless told.
	defaultListen string
	// migrateCommand: `gpuproxy migrate` exists; migrateLock: migrating
	// takes a Postgres advisory lock.
	migrateCommand, migrateLock bool
	// image is the Dockerfile's image name (its docker build -t),
	// imageUser its final USER, entrypoint its ENTRYPOINT, exposed its
	// EXPOSEd ports.
	image, imageUser string
	entrypoint       []string
	exposed          []int
}

// loadFacts reads the facts out of src (readSources); problems says what
// it could not find.
func loadFacts(src map[string]string) (f sourceFacts, problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	parse := func(name string) *ast.File {
		file, err := parser.ParseFile(token.NewFileSet(), name, src[name], 0)
		if err != nil {
			bad("parsing %s: %v", name, err)
			return &ast.File{}
		}
		return file
	}

	f.rootGETs = rootGETs(parse("server/routes.go"))
	if len(f.rootGETs) == 0 {
		bad("server/routes.go: found no GET route on the root router in (*Server).routes: has it changed shape?")
	}
	handlers := parse("server/handlers.go")
	if fn := findFunc(handlers, "ready"); fn == nil {
		bad("server/handlers.go: no ready handler")
	} else if f.readyTimeout = timeoutIn(fn.Body, durationConsts(handlers)); f.readyTimeout == 0 {
		bad("server/handlers.go: ready sets no context.WithTimeout")
	}
	consts := durationConsts(parse("app/config.go"))
	f.shutdownTimeout, f.closeTimeout = consts["shutdownTimeout"], consts["closeTimeout"]
	if f.shutdownTimeout == 0 || f.closeTimeout == 0 {
		bad("app/config.go: no shutdownTimeout and closeTimeout durations (got %v)", consts)
	}
	if fn := findFunc(parse("db/db.go"), "Migrate"); fn == nil {
		bad("db/db.go: no Migrate")
	} else {
		f.migrateLock = containsString(fn.Body, "pg_advisory_xact_lock") || containsString(fn.Body, "pg_advisory_lock")
	}

	var pkg []*ast.File
	for name := range src {
		if strings.HasPrefix(name, configPkg+"/") {
			pkg = append(pkg, parse(name))
		}
	}
	structs := map[string]*ast.StructType{}
	for _, file := range pkg {
		ast.Inspect(file, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st
				}
			}
			return true
		})
		if fn := findFunc(file, "envOverrides"); fn != nil {
			f.envNames = envOverrideNames(fn.Body)
		}
		if fn := findFunc(file, "command"); fn != nil {
			f.migrateCommand = hasCase(fn.Body, "migrate")
		}
		if v, ok := stringConsts(file)["defaultListen"]; ok {
			f.defaultListen = v
		}
	}
	if structs["config"] == nil {
		bad("%s: no config struct", configPkg)
	} else {
		f.config = yamlKeys(structs["config"], structs, 0)
	}
	if len(f.envNames) == 0 {
		bad("%s: no environment variables found in envOverrides", configPkg)
	}
	if f.defaultListen == "" {
		bad("%s: no defaultListen constant", configPkg)
	}

	dockerfile := src[dockerfileName]
	if m := dockerBuildTag.FindStringSubmatch(dockerfile); m == nil {
		bad("%s: no `docker build -t NAME` line names the image", dockerfileName)
	} else {
		name, _, _ := strings.Cut(m[1], ":")
		f.image = name[strings.LastIndex(name, "/")+1:] // the repository's last part: registries add their own prefix
	}
	_, stages := parseDockerfile(dockerfile)
	if len(stages) > 0 {
		for _, in := range stages[len(stages)-1].instrs {
			switch in.cmd {
			case "USER":
				f.imageUser = in.args
			case "ENTRYPOINT":
				f.entrypoint = execForm(in.args)
			}
		}
	}
	_, f.exposed = checkDockerfile(dockerfile)
	return f, problems
}

// dockerBuildTag finds the image name in the Dockerfile's build comment.
var dockerBuildTag = regexp.MustCompile(`(?m)^#\s*docker build -t (\S+)`)

// findFunc returns the function or method name declared in file.
func findFunc(file *ast.File, name string) *ast.FuncDecl {
	for _, d := range file.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name && fn.Body != nil {
			return fn
		}
	}
	return nil
}

// stringLit returns the value of a string literal expression.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// rootGETs finds, in (*Server).routes, the GET registrations on the root
// router (the variable assigned from s.e): path → registered
// unconditionally (a statement of the function's body, not nested).
func rootGETs(file *ast.File) map[string]bool {
	fn := findFunc(file, "routes")
	if fn == nil {
		return nil
	}
	root := ""
	for _, st := range fn.Body.List {
		if as, ok := st.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
			if sel, ok := as.Rhs[0].(*ast.SelectorExpr); ok && sel.Sel.Name == "e" {
				if id, ok := as.Lhs[0].(*ast.Ident); ok {
					root = id.Name
				}
			}
		}
	}
	top := map[ast.Node]bool{}
	for _, st := range fn.Body.List {
		if es, ok := st.(*ast.ExprStmt); ok {
			top[es.X] = true
		}
	}
	out := map[string]bool{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "GET" {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); !ok || id.Name != root {
			return true
		}
		if path, ok := stringLit(call.Args[0]); ok {
			out[path] = out[path] || top[call]
		}
		return true
	})
	return out
}

// durationExpr evaluates N * time.Unit (or time.Unit * N, or time.Unit).
func durationExpr(e ast.Expr) time.Duration {
	units := map[string]time.Duration{"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute, "Hour": time.Hour}
	switch v := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := v.X.(*ast.Ident); ok && id.Name == "time" {
			return units[v.Sel.Name]
		}
	case *ast.BasicLit:
		if n, err := strconv.Atoi(v.Value); err == nil && v.Kind == token.INT {
			return time.Duration(n)
		}
	case *ast.ParenExpr:
		return durationExpr(v.X)
	case *ast.BinaryExpr:
		if v.Op == token.MUL {
			return durationExpr(v.X) * durationExpr(v.Y)
		}
	}
	return 0
}

// durationConsts are file's constants of the form N * time.Unit.
func durationConsts(file *ast.File) map[string]time.Duration {
	out := map[string]time.Duration{}
	ast.Inspect(file, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if d := durationExpr(vs.Values[i]); d > 0 {
						out[name.Name] = d
					}
				}
			}
		}
		return true
	})
	return out
}

// stringConsts are file's string constants.
func stringConsts(file *ast.File) map[string]string {
	out := map[string]string{}
	for _, d := range file.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := stringLit(vs.Values[i]); ok {
						out[name.Name] = s
					}
				}
			}
		}
	}
	return out
}

// timeoutIn is the duration of the first context.WithTimeout in body: a
// literal, or a named constant of consts.
func timeoutIn(body ast.Node, consts map[string]time.Duration) time.Duration {
	var d time.Duration
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || d != 0 || len(call.Args) != 2 {
			return d == 0
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithTimeout" {
			d = durationExpr(call.Args[1])
			if id, ok := call.Args[1].(*ast.Ident); ok && d == 0 {
				d = consts[id.Name]
			}
		}
		return d == 0
	})
	return d
}

// containsString tells whether a string literal in body contains s.
func containsString(body ast.Node, s string) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if v, ok := stringLit(asExpr(n)); ok && strings.Contains(v, s) {
			found = true
		}
		return !found
	})
	return found
}

func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}

// hasCase tells whether a switch in body has a case for the string s.
func hasCase(body ast.Node, s string) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if cc, ok := n.(*ast.CaseClause); ok {
			for _, e := range cc.List {
				if v, ok := stringLit(e); ok && v == s {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// envOverrideNames are the names in envOverrides' list: the first string
// of each {"NAME", setter} element.
func envOverrideNames(body ast.Node) map[string]bool {
	out := map[string]bool{}
	ast.Inspect(body, func(n ast.Node) bool {
		if cl, ok := n.(*ast.CompositeLit); ok && cl.Type == nil && len(cl.Elts) == 2 {
			if name, ok := stringLit(cl.Elts[0]); ok {
				out[name] = true
			}
		}
		return true
	})
	return out
}

// yamlKeys is the key tree of a struct decoded by yaml.v3: exported fields
// by their yaml tag (or lower-cased name), nested through the package's
// own struct types and slices of them.
func yamlKeys(st *ast.StructType, structs map[string]*ast.StructType, depth int) configKeys {
	keys := configKeys{}
	if depth > 8 {
		return keys
	}
	for _, field := range st.Fields.List {
		tag := ""
		if field.Tag != nil {
			raw, _ := strconv.Unquote(field.Tag.Value)
			tag, _, _ = strings.Cut(reflect.StructTag(raw).Get("yaml"), ",")
		}
		node := &configNode{}
		typ := field.Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if arr, ok := typ.(*ast.ArrayType); ok {
			if id, ok := arr.Elt.(*ast.Ident); ok && structs[id.Name] != nil {
				node.list, typ = true, id
			}
		}
		if id, ok := typ.(*ast.Ident); ok && structs[id.Name] != nil {
			node.keys = yamlKeys(structs[id.Name], structs, depth+1)
		}
		if node.keys == nil {
			node = nil // a leaf
		}
		for _, name := range field.Names {
			if !name.IsExported() || tag == "-" {
				continue
			}
			key := tag
			if key == "" {
				key = strings.ToLower(name.Name)
			}
			keys[key] = node
		}
	}
	return keys
}
