package deploycheck_test

// Checks on what an operator sets: POSTGRES_PASSWORD has no default, the
// port is published on loopback unless asked otherwise, and .env.example
// lists every variable docker-compose.yml reads, each with a comment and
// no secret filled in.

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/dotenv"
)

const envExample = ".env.example"

// composeVar finds the variables a compose file interpolates.
var composeVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`)

// composeVars returns the variables compose reads, sorted.
func composeVars(compose string) []string {
	seen := map[string]bool{}
	for _, m := range composeVar.FindAllStringSubmatch(compose, -1) {
		seen[m[1]] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// isSecret tells the variables whose example value must stay empty.
func isSecret(name string) bool {
	return name == "POSTGRES_PASSWORD" || strings.HasSuffix(name, "_SECRET") || strings.HasSuffix(name, "_API_KEY")
}

// checkEnvExample returns what is wrong with example against compose.
func checkEnvExample(compose, example string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	values, err := dotenv.UnmarshalWithLookup(example, func(string) (string, bool) { return "", false })
	if err != nil {
		return []string{fmt.Sprintf("%s does not parse: %v", envExample, err)}
	}
	// Which variables have a comment in the block right above them.
	commented := map[string]bool{}
	comment := false
	for line := range strings.SplitSeq(example, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
			comment = false
		case strings.HasPrefix(line, "#"):
			comment = true
		default:
			name, _, _ := strings.Cut(line, "=")
			commented[strings.TrimSpace(name)] = comment
		}
	}
	used := composeVars(compose)
	for _, v := range used {
		if _, ok := values[v]; !ok {
			bad("%s does not list %s, which %s reads", envExample, v, composeFile)
		} else if !commented[v] {
			bad("%s lists %s without a comment saying what it is", envExample, v)
		}
	}
	for _, v := range slices.Sorted(maps.Keys(values)) {
		if !slices.Contains(used, v) {
			bad("%s lists %s, which %s does not read", envExample, v, composeFile)
		}
		if isSecret(v) && values[v] != "" {
			bad("%s fills in the secret %s: leave it empty", envExample, v)
		}
	}
	return problems
}

func TestEnvExample(t *testing.T) {
	root := moduleRoot(t)
	compose, example := readFile(t, composeFile), readFile(t, envExample)
	for _, problem := range checkEnvExample(compose, example) {
		t.Error(problem)
	}
	// The example, with the password filled in, is a stack that passes
	// every compose check.
	env, err := dotenv.UnmarshalWithLookup(example, nil)
	if err != nil {
		t.Fatal(err)
	}
	env["POSTGRES_PASSWORD"] = "pw"
	p, err := loadCompose(t, compose, env)
	if err != nil {
		t.Fatalf("loading %s with %s: %v", composeFile, envExample, err)
	}
	for _, problem := range checkCompose(p, root, env) {
		t.Error(problem)
	}
	// .env holds secrets: git and the image build leave it out.
	if !slices.Contains(strings.Fields(readFile(t, ".gitignore")), "/.env") {
		t.Error(".gitignore does not list /.env")
	}
	if !slices.Contains(strings.Fields(readFile(t, ".dockerignore")), ".env") {
		t.Error(".dockerignore does not list .env")
	}
}

func TestEnvExampleChecksCatchBreakage(t *testing.T) {
	compose, example := readFile(t, composeFile), readFile(t, envExample)
	for _, m := range []struct{ name, compose, example, want string }{
		{"variable missing", compose, strings.Replace(example, "\nGPUPROXY_OAUTH_ISSUER=\n", "\n", 1), "does not list GPUPROXY_OAUTH_ISSUER"},
		{"new compose variable", strings.Replace(compose, "${GPUPROXY_LOG_LEVEL:-info}", "${GPUPROXY_LOG_LEVEL:-info}${GPUPROXY_NEW:-}", 1),
			example, "does not list GPUPROXY_NEW"},
		{"stale variable", compose, example + "\n# gone\nGPUPROXY_OLD=1\n", "GPUPROXY_OLD, which"},
		{"no comment", compose, strings.Replace(example, "\nIONET_API_KEY=\n", "\n\nIONET_API_KEY=\n", 1), "IONET_API_KEY without a comment"},
		{"secret filled in", compose, strings.Replace(example, "\nPOSTGRES_PASSWORD=\n", "\nPOSTGRES_PASSWORD=gpuproxy\n", 1), "fills in the secret POSTGRES_PASSWORD"},
	} {
		t.Run(m.name, func(t *testing.T) {
			if m.compose == compose && m.example == example {
				t.Fatal("mutation changes nothing: update it")
			}
			problems := checkEnvExample(m.compose, m.example)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, m.want) }) {
				t.Errorf("no problem mentioning %q; got %q", m.want, problems)
			}
		})
	}
}

// checkPasswordRequired: without POSTGRES_PASSWORD (unset or empty) the
// stack refuses to load, saying which variable is missing.
func checkPasswordRequired(t *testing.T, compose string) []string {
	t.Helper()
	var problems []string
	for name, env := range map[string]map[string]string{"unset": {}, "empty": {"POSTGRES_PASSWORD": ""}} {
		_, err := loadCompose(t, compose, env)
		switch {
		case err == nil:
			problems = append(problems, fmt.Sprintf("POSTGRES_PASSWORD %s: the stack loads (with a default password)", name))
		case !strings.Contains(err.Error(), "POSTGRES_PASSWORD"):
			problems = append(problems, fmt.Sprintf("POSTGRES_PASSWORD %s: the refusal does not name it: %v", name, err))
		}
	}
	return problems
}

func TestComposeRequiresPostgresPassword(t *testing.T) {
	compose := readFile(t, composeFile)
	for _, problem := range checkPasswordRequired(t, compose) {
		t.Error(problem)
	}
	const required = "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (see .env.example)}"
	if strings.Count(compose, required) != 2 {
		t.Fatalf("%s no longer has %q twice: update this mutation", composeFile, required)
	}
	if len(checkPasswordRequired(t, strings.ReplaceAll(compose, required, "${POSTGRES_PASSWORD:-gpuproxy}"))) == 0 {
		t.Error("a default password passes")
	}
}

func TestComposePublishesOnLoopbackByDefault(t *testing.T) {
	root := moduleRoot(t)
	compose := readFile(t, composeFile)
	const def = "${GPUPROXY_PUBLISH:-127.0.0.1:8080}"
	if !strings.Contains(compose, def) {
		t.Fatalf("%s no longer contains %q: update this mutation", composeFile, def)
	}
	// GPUPROXY_PUBLISH moves it, e.g. onto every interface.
	everywhere := map[string]string{"POSTGRES_PASSWORD": "pw", publishEnv: "0.0.0.0:8080"}
	for _, c := range []struct {
		name, compose string
		env           map[string]string
		ok            bool
	}{
		{"as is", compose, minimalEnv, true},
		{"as is, overridden", compose, everywhere, true},
		{"every interface by default", strings.Replace(compose, def, "${GPUPROXY_PUBLISH:-8080}", 1), minimalEnv, false},
		{"not overridable", strings.Replace(compose, def, "127.0.0.1:8080", 1), everywhere, false},
	} {
		p, err := loadCompose(t, c.compose, c.env)
		if err != nil {
			t.Fatal(err)
		}
		problems := checkCompose(p, root, c.env)
		if got := !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, "host address") }); got != c.ok {
			t.Errorf("%s: loopback check passes=%v, want %v (%q)", c.name, got, c.ok, problems)
		}
	}
}
