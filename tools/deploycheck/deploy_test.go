package deploycheck_test

// Checks on the container deployment: docker-compose.yml (loaded with
// compose-go, the library docker compose itself uses), the Dockerfile and
// .dockerignore. No Docker engine is needed.
//
// Every check reports problems instead of failing directly, so the
// *CatchBreakage tests can feed deliberately broken copies of the files and
// prove that each check is able to fail.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

const (
	composeFile    = "docker-compose.yml"
	dockerfileName = "Dockerfile"
	dbService      = "postgres"
	appService     = "gpuproxy"
	appPort        = 8080
	pgDataDir      = "/var/lib/postgresql/data"
)

// secretEnv are passed from the host environment into the gpuproxy service.
var secretEnv = []string{"GPUPROXY_JWT_SECRET", "GPUPROXY_CONSOLE_SECRET", "GPUPROXY_OAUTH_ISSUER",
	"VASTAI_API_KEY", "IONET_API_KEY"}

// publishEnv overrides where the host publishes the gpuproxy port.
const publishEnv = "GPUPROXY_PUBLISH"

// minimalEnv is the least environment the stack loads with: the database
// password has no default.
var minimalEnv = map[string]string{"POSTGRES_PASSWORD": "pw"}

// moduleRoot is the product module's root, two folders up from this
// package (go test runs in the package folder).
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"go.mod", composeFile, dockerfileName} {
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			t.Fatalf("%s is not the product module root: %v", root, err)
		}
	}
	return root
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// loadCompose loads compose content as docker compose would, with env as the
// only environment (the test's own environment must not leak in).
func loadCompose(t *testing.T, content string, env map[string]string, opts ...func(*loader.Options)) (*types.Project, error) {
	t.Helper()
	root := moduleRoot(t)
	opts = append([]func(*loader.Options){func(o *loader.Options) { o.SetProjectName("gpuproxy", true) }}, opts...)
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, composeFile), Content: []byte(content)}},
		Environment: maps.Clone(env), // the loader adds COMPOSE_PROJECT_NAME to it
	}, opts...)
}

func envValue(m types.MappingWithEquals, key string) (string, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", false
	}
	return *v, true
}

// checkCompose returns what is wrong with the stack; env is the environment
// it was loaded with.
func checkCompose(p *types.Project, root string, env map[string]string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	pg, okPG := p.Services[dbService]
	app, okApp := p.Services[appService]
	if !okPG {
		bad("no %q service (services: %v)", dbService, slices.Sorted(maps.Keys(p.Services)))
	}
	if !okApp {
		bad("no %q service (services: %v)", appService, slices.Sorted(maps.Keys(p.Services)))
	}
	if !okPG || !okApp {
		return problems
	}

	// postgres
	if pg.Image != "postgres:16" {
		bad("postgres image is %q, want postgres:16", pg.Image)
	}
	pgUser, _ := envValue(pg.Environment, "POSTGRES_USER")
	pgPass, _ := envValue(pg.Environment, "POSTGRES_PASSWORD")
	pgDB, _ := envValue(pg.Environment, "POSTGRES_DB")
	if pgUser == "" || pgPass == "" || pgDB == "" {
		bad("postgres needs POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB, got user=%q db=%q password set=%v",
			pgUser, pgDB, pgPass != "")
	}
	if hc := pg.HealthCheck; hc == nil || hc.Disable || len(hc.Test) == 0 {
		bad("postgres has no healthcheck")
	} else {
		args := healthArgs(hc.Test)
		if len(args) == 0 || path.Base(args[0]) != "pg_isready" {
			bad("postgres healthcheck %q does not run pg_isready", hc.Test)
		} else {
			if u := flagValue(args, "-U", "--username"); u != pgUser {
				bad("postgres healthcheck checks user %q, POSTGRES_USER is %q", u, pgUser)
			}
			if d := flagValue(args, "-d", "--dbname"); d != pgDB {
				bad("postgres healthcheck checks database %q, POSTGRES_DB is %q", d, pgDB)
			}
		}
		if hc.Interval == nil || hc.Timeout == nil || hc.Retries == nil {
			bad("postgres healthcheck should set interval, timeout and retries")
		}
	}
	var dataVol *types.ServiceVolumeConfig
	for i, v := range pg.Volumes {
		if v.Target == pgDataDir {
			dataVol = &pg.Volumes[i]
		}
	}
	switch {
	case dataVol == nil:
		bad("postgres mounts nothing at %s: data would be lost with the container", pgDataDir)
	case dataVol.Type != types.VolumeTypeVolume:
		bad("postgres data at %s is a %s mount, want a named volume", pgDataDir, dataVol.Type)
	default:
		if _, ok := p.Volumes[dataVol.Source]; !ok {
			bad("volume %q mounted at %s is not declared under top-level volumes", dataVol.Source, pgDataDir)
		}
	}

	// gpuproxy: build
	if b := app.Build; b == nil {
		bad("gpuproxy has no build section")
	} else {
		if filepath.Clean(b.Context) != filepath.Clean(root) {
			bad("gpuproxy build context is %q, want the repository root %q", b.Context, root)
		}
		df := b.Dockerfile
		if df == "" {
			df = dockerfileName
		}
		if !filepath.IsAbs(df) {
			df = filepath.Join(b.Context, df)
		}
		if _, err := os.Stat(df); err != nil {
			bad("gpuproxy Dockerfile: %v", err)
		}
	}

	// gpuproxy: start order
	if dep, ok := app.DependsOn[dbService]; !ok {
		bad("gpuproxy does not depend on %s", dbService)
	} else if dep.Condition != types.ServiceConditionHealthy {
		bad("gpuproxy depends on %s with condition %q, want %s", dbService, dep.Condition, types.ServiceConditionHealthy)
	}

	// gpuproxy: database URL
	if raw, ok := envValue(app.Environment, "DATABASE_URL"); !ok {
		bad("gpuproxy has no DATABASE_URL")
	} else if u, err := url.Parse(raw); err != nil {
		bad("gpuproxy DATABASE_URL does not parse: %v", err)
	} else {
		pass, _ := u.User.Password()
		switch {
		case u.Scheme != "postgres" && u.Scheme != "postgresql":
			bad("DATABASE_URL scheme is %q, want postgres", u.Scheme)
		case u.Hostname() != dbService:
			bad("DATABASE_URL host is %q, want the %s service", u.Hostname(), dbService)
		}
		if u.Port() != "5432" {
			bad("DATABASE_URL port is %q, want 5432", u.Port())
		}
		if u.User.Username() != pgUser {
			bad("DATABASE_URL user is %q, POSTGRES_USER is %q", u.User.Username(), pgUser)
		}
		if pass != pgPass {
			bad("DATABASE_URL password does not match POSTGRES_PASSWORD")
		}
		if db := strings.TrimPrefix(u.Path, "/"); db != pgDB {
			bad("DATABASE_URL database is %q, POSTGRES_DB is %q", db, pgDB)
		}
		if m := u.Query().Get("sslmode"); m != "disable" {
			bad("DATABASE_URL sslmode is %q; the postgres image serves no TLS, want disable", m)
		}
	}

	// gpuproxy: secrets come from the host environment, never the file
	for _, k := range secretEnv {
		got, ok := envValue(app.Environment, k)
		if !ok {
			bad("gpuproxy does not pass %s", k)
		} else if got != env[k] {
			bad("gpuproxy %s is %q, want the host's value %q", k, got, env[k])
		}
	}

	// gpuproxy: published port, on loopback unless the host says otherwise
	wantIP := "127.0.0.1"
	if v := env[publishEnv]; v != "" {
		wantIP, _, _ = strings.Cut(v, ":")
	}
	if !slices.ContainsFunc(app.Ports, func(pc types.ServicePortConfig) bool {
		return pc.Target == appPort && pc.Published == strconv.Itoa(appPort)
	}) {
		bad("gpuproxy does not publish %d:%d (ports: %+v)", appPort, appPort, app.Ports)
	}
	for _, pc := range app.Ports {
		if pc.HostIP != wantIP {
			bad("gpuproxy publishes port %s on host address %q, want %q", pc.Published, pc.HostIP, wantIP)
		}
	}

	// gpuproxy: healthcheck on /health at the container port
	if hc := app.HealthCheck; hc == nil || hc.Disable || len(hc.Test) == 0 {
		bad("gpuproxy has no healthcheck")
	} else {
		u := healthURL(healthArgs(hc.Test))
		if u == nil || u.Path != "/health" || u.Port() != strconv.Itoa(appPort) {
			bad("gpuproxy healthcheck %q does not GET /health on port %d", hc.Test, appPort)
		}
	}
	if app.Restart != types.RestartPolicyUnlessStopped {
		bad("gpuproxy restart policy is %q, want %s", app.Restart, types.RestartPolicyUnlessStopped)
	}
	return problems
}

// healthArgs returns the command of a healthcheck test as words.
func healthArgs(test types.HealthCheckTest) []string {
	if len(test) == 0 {
		return nil
	}
	switch test[0] {
	case "CMD":
		return test[1:]
	case "CMD-SHELL":
		return strings.Fields(strings.Join(test[1:], " "))
	}
	return nil
}

// flagValue finds "-U x", "-Ux" or "--username=x" in args.
func flagValue(args []string, short, long string) string {
	for i, a := range args {
		switch {
		case a == short || a == long:
			if i+1 < len(args) {
				return args[i+1]
			}
		case strings.HasPrefix(a, long+"="):
			return strings.TrimPrefix(a, long+"=")
		case strings.HasPrefix(a, short) && len(a) > len(short) && !strings.HasPrefix(a, "--"):
			return strings.TrimPrefix(a, short)
		}
	}
	return ""
}

func healthURL(args []string) *url.URL {
	for _, a := range args {
		if strings.HasPrefix(a, "http://") {
			if u, err := url.Parse(a); err == nil {
				return u
			}
		}
	}
	return nil
}

func TestComposeStack(t *testing.T) {
	root := moduleRoot(t)
	content := readFile(t, composeFile)
	for name, env := range map[string]map[string]string{
		"defaults": minimalEnv,
		"host env": {"POSTGRES_PASSWORD": "s3cret-pw", "GPUPROXY_JWT_SECRET": "jwt-secret",
			"GPUPROXY_CONSOLE_SECRET": "console-secret", "GPUPROXY_OAUTH_ISSUER": "https://gpuproxy.example.com",
			"VASTAI_API_KEY": "vast-key", "IONET_API_KEY": "ionet-key", publishEnv: "0.0.0.0:8080"},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := loadCompose(t, content, env)
			if err != nil {
				t.Fatalf("loading %s: %v", composeFile, err)
			}
			for _, problem := range checkCompose(p, root, env) {
				t.Error(problem)
			}
			if pw := env["POSTGRES_PASSWORD"]; pw != "" {
				got, _ := envValue(p.Services[dbService].Environment, "POSTGRES_PASSWORD")
				if got != pw {
					t.Errorf("POSTGRES_PASSWORD from the host is ignored: postgres gets %q", got)
				}
			}
		})
	}
}

func TestComposeChecksCatchBreakage(t *testing.T) {
	root := moduleRoot(t)
	content := readFile(t, composeFile)
	env := map[string]string{"POSTGRES_PASSWORD": "pw", "GPUPROXY_JWT_SECRET": "j", "GPUPROXY_CONSOLE_SECRET": "c",
		"GPUPROXY_OAUTH_ISSUER": "https://o.example", "VASTAI_API_KEY": "v", "IONET_API_KEY": "i"}
	for _, m := range []struct{ old, new, want string }{
		{"\n  gpuproxy:\n", "\n  api:\n", `no "gpuproxy" service`},
		{"\n  postgres:\n", "\n  db:\n", `no "postgres" service`},
		{"image: postgres:16", "image: postgres:15", "postgres image"},
		{`"pg_isready -U gpuproxy -d gpuproxy"`, `"true"`, "does not run pg_isready"},
		{`pg_isready -U gpuproxy -d gpuproxy`, `pg_isready -U postgres -d gpuproxy`, "healthcheck checks user"},
		{"      retries: 10\n", "", "interval, timeout and retries"},
		{"- pgdata:/var/lib/postgresql/data", "- pgdata:/data", "mounts nothing"},
		{"- pgdata:/var/lib/postgresql/data", "- ./data:/var/lib/postgresql/data", "named volume"},
		{"\nvolumes:\n  pgdata:\n", "\n", "not declared under top-level volumes"},
		{"context: .\n", "context: ./cmd\n", "build context"},
		{"dockerfile: Dockerfile", "dockerfile: Containerfile", "Dockerfile"},
		{"condition: service_healthy", "condition: service_started", "want service_healthy"},
		{"@postgres:5432/", "@localhost:5432/", "host"},
		{"@postgres:5432/", "@postgres:5433/", "port"},
		{"postgres://gpuproxy:", "postgres://admin:", "DATABASE_URL user"},
		{"${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (see .env.example)}@", "gpuproxy@", "password"},
		{"POSTGRES_DB: gpuproxy", "POSTGRES_DB: other", "DATABASE_URL database"},
		{"sslmode=disable", "sslmode=require", "sslmode"},
		{"VASTAI_API_KEY: ${VASTAI_API_KEY:-}", "VASTAI_API_KEY: baked-in", "VASTAI_API_KEY"},
		{"      IONET_API_KEY: ${IONET_API_KEY:-}\n", "", "IONET_API_KEY"},
		{"      GPUPROXY_CONSOLE_SECRET: ${GPUPROXY_CONSOLE_SECRET:-}\n", "", "GPUPROXY_CONSOLE_SECRET"},
		{"GPUPROXY_OAUTH_ISSUER: ${GPUPROXY_OAUTH_ISSUER:-}", "GPUPROXY_OAUTH_ISSUER: http://localhost:8080", "GPUPROXY_OAUTH_ISSUER"},
		{`127.0.0.1:8080}:8080"`, `127.0.0.1:9090}:8080"`, "does not publish"},
		{`127.0.0.1:8080}:8080"`, `127.0.0.1:8080}:9090"`, "does not publish"},
		{`"${GPUPROXY_PUBLISH:-127.0.0.1:8080}:8080"`, `"8080:8080"`, "host address"},
		{"http://127.0.0.1:8080/health", "http://127.0.0.1:8080/ready-not", "/health"},
		{"http://127.0.0.1:8080/health", "http://127.0.0.1:9090/health", "/health"},
		{"restart: unless-stopped\n    depends_on", "restart: \"no\"\n    depends_on", "restart policy"},
	} {
		t.Run(m.old+"→"+m.new, func(t *testing.T) {
			if !strings.Contains(content, m.old) {
				t.Fatalf("%s no longer contains %q: update this mutation", composeFile, m.old)
			}
			broken := strings.Replace(content, m.old, m.new, 1)
			// Skip the loader's own consistency check so that our checks,
			// not compose-go, must notice e.g. an undeclared volume.
			p, err := loadCompose(t, broken, env, func(o *loader.Options) { o.SkipConsistencyCheck = true })
			if err != nil {
				t.Fatalf("broken file does not load, so it exercises no check: %v", err)
			}
			problems := checkCompose(p, root, env)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, m.want) }) {
				t.Errorf("no problem mentioning %q; got %q", m.want, problems)
			}
		})
	}
}

// instruction is one Dockerfile instruction, continuations joined.
type instruction struct {
	cmd  string // upper case
	args string
}

// stage is one FROM … block.
type stage struct {
	from, name string
	instrs     []instruction
}

func parseDockerfile(src string) (globalArgs map[string]string, stages []stage) {
	var instrs []instruction
	var cur strings.Builder
	flush := func() {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return
		}
		cmd, args, _ := strings.Cut(s, " ")
		instrs = append(instrs, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
	}
	for line := range strings.SplitSeq(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") { // comments, also inside continuations
			continue
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()

	globalArgs = map[string]string{}
	for _, in := range instrs {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = expandArgs(f[i], globalArgs)
				}
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" {
				k, v, _ := strings.Cut(in.args, "=")
				globalArgs[k] = v
			}
			continue
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	return globalArgs, stages
}

var argRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

func expandArgs(s string, args map[string]string) string {
	return argRef.ReplaceAllStringFunc(s, func(ref string) string {
		m := argRef.FindStringSubmatch(ref)
		return args[m[1]+m[2]]
	})
}

// execForm parses a JSON-array ENTRYPOINT/CMD; nil for shell form.
func execForm(args string) []string {
	var v []string
	if json.Unmarshal([]byte(args), &v) != nil {
		return nil
	}
	return v
}

// checkDockerfile returns what is wrong with the Dockerfile and the ports the
// final image EXPOSEs.
func checkDockerfile(src string) (problems []string, exposed []int) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	_, stages := parseDockerfile(src)
	if len(stages) < 2 {
		return []string{fmt.Sprintf("want a multi-stage build, got %d stage(s)", len(stages))}, nil
	}
	builder, final := stages[0], stages[len(stages)-1]

	if !strings.HasPrefix(builder.from, "golang:1.26") || !strings.Contains(builder.from, "bookworm") {
		bad("builder image is %q, want golang:1.26 on bookworm", builder.from)
	}
	cgoOff, versionArg := false, false
	copiedMods, downloaded, copiedAll, built := false, false, false, false
	for _, in := range builder.instrs {
		switch in.cmd {
		case "ENV":
			if f := strings.Fields(strings.ReplaceAll(in.args, "=", " ")); slices.Index(f, "CGO_ENABLED") >= 0 {
				i := slices.Index(f, "CGO_ENABLED")
				cgoOff = i+1 < len(f) && f[i+1] == "0"
			}
		case "ARG":
			if strings.HasPrefix(in.args, "VERSION") {
				versionArg = true
			}
		case "COPY":
			f := strings.Fields(in.args)
			if slices.Contains(f, "go.mod") && slices.Contains(f, "go.sum") {
				copiedMods = true
			}
			if len(f) >= 2 && slices.Contains(f[:len(f)-1], ".") {
				if !downloaded {
					bad("the source is copied before `go mod download`: dependencies are not cached in their own layer")
				}
				copiedAll = true
			}
		case "RUN":
			if strings.Contains(in.args, "go mod download") {
				if !copiedMods {
					bad("`go mod download` runs before go.mod and go.sum are copied")
				}
				downloaded = true
			}
			if strings.Contains(in.args, "go build") {
				built = true
				if !copiedAll {
					bad("`go build` runs before the source is copied")
				}
				if strings.Contains(in.args, "CGO_ENABLED=0") {
					cgoOff = true
				}
				if !cgoOff {
					bad("go build runs without CGO_ENABLED=0: the binary would not be static")
				}
				if !versionArg {
					bad("go build runs without ARG VERSION")
				}
				for _, want := range []string{"./cmd/gpuproxy", "-trimpath", "-s -w", "-X main.version=${VERSION}"} {
					if !strings.Contains(in.args, want) {
						bad("go build does not use %q: %s", want, in.args)
					}
				}
			}
		}
	}
	if !downloaded {
		bad("builder never runs `go mod download`")
	}
	if !built {
		bad("builder never runs `go build`")
	}

	var user string
	var entrypoint, cmd []string
	copiedBinary := false
	for _, in := range final.instrs {
		switch in.cmd {
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					bad("EXPOSE %q is not a TCP port", p)
					continue
				}
				exposed = append(exposed, n)
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = execForm(in.args)
		case "CMD":
			cmd = execForm(in.args)
		case "COPY":
			if (strings.Contains(in.args, "--from="+builder.name+" ") || strings.Contains(in.args, "--from=0 ")) &&
				strings.HasSuffix(in.args, " /gpuproxy") {
				copiedBinary = true
			}
		}
	}
	if !copiedBinary {
		bad("final stage does not copy the binary from the builder to /gpuproxy")
	}
	if !slices.Contains(exposed, appPort) {
		bad("final image does not EXPOSE %d (EXPOSEs %v)", appPort, exposed)
	}
	if name, _, _ := strings.Cut(user, ":"); name == "" || name == "root" || name == "0" {
		bad("final image runs as %q, want a non-root USER", user)
	}
	if !slices.Equal(entrypoint, []string{"/gpuproxy"}) {
		bad(`ENTRYPOINT is %q, want ["/gpuproxy"]`, entrypoint)
	}
	if len(cmd) == 0 || cmd[0] != "serve" {
		bad("CMD %q does not run serve", cmd)
	} else if i := slices.Index(cmd, "--listen"); i < 0 || i+1 >= len(cmd) {
		bad("CMD %q sets no --listen address (the default is loopback only)", cmd)
	} else if host, port, _ := strings.Cut(cmd[i+1], ":"); host != "0.0.0.0" || !slices.Contains(exposed, atoi(port)) {
		bad("CMD listens on %q: want 0.0.0.0 on an EXPOSEd port %v", cmd[i+1], exposed)
	}
	return problems, exposed
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func TestDockerfile(t *testing.T) {
	problems, _ := checkDockerfile(readFile(t, dockerfileName))
	for _, p := range problems {
		t.Error(p)
	}
}

func TestDockerfileChecksCatchBreakage(t *testing.T) {
	src := readFile(t, dockerfileName)
	for _, m := range []struct{ old, new, want string }{
		{"ARG GO_VERSION=1.26", "ARG GO_VERSION=1.25", "golang:1.26"},
		{"golang:${GO_VERSION}-bookworm", "golang:${GO_VERSION}-alpine", "bookworm"},
		{"ENV CGO_ENABLED=0", "ENV CGO_ENABLED=1", "CGO_ENABLED=0"},
		{"COPY go.mod go.sum ./\n", "", "before go.mod"},
		{"RUN go mod download && go mod verify\n", "", "go mod download"},
		{"ARG VERSION=dev\n", "", "ARG VERSION"},
		{"./cmd/gpuproxy", "./cmd/other", "./cmd/gpuproxy"},
		{"-trimpath ", "", "-trimpath"},
		{"-X main.version=${VERSION}", "-X main.version=dev", "main.version"},
		{"COPY --from=build /out/gpuproxy /gpuproxy", "COPY --from=build /out/gpuproxy /usr/bin/gpuproxy", "copy the binary"},
		{"EXPOSE 8080", "EXPOSE 9090", "EXPOSE 8080"},
		{"USER 10001:10001", "USER root", "non-root"},
		{`ENTRYPOINT ["/gpuproxy"]`, `ENTRYPOINT ["/bin/sh"]`, "ENTRYPOINT"},
		{`"0.0.0.0:8080"`, `"127.0.0.1:8080"`, "want 0.0.0.0"},
		{`CMD ["serve", "--listen", "0.0.0.0:8080"]`, `CMD ["serve"]`, "no --listen"},
		{"FROM debian:bookworm-slim AS runtime\n", "", "multi-stage"},
	} {
		t.Run(m.old+"→"+m.new, func(t *testing.T) {
			if !strings.Contains(src, m.old) {
				t.Fatalf("%s no longer contains %q: update this mutation", dockerfileName, m.old)
			}
			problems, _ := checkDockerfile(strings.Replace(src, m.old, m.new, 1))
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, m.want) }) {
				t.Errorf("no problem mentioning %q; got %q", m.want, problems)
			}
		})
	}
}

// checkPortsAgree: the container port compose publishes and health-checks is
// one the image EXPOSEs and its CMD listens on.
func checkPortsAgree(p *types.Project, exposed []int) []string {
	app, ok := p.Services[appService]
	if !ok {
		return []string{"no gpuproxy service"}
	}
	var problems []string
	for _, pc := range app.Ports {
		if !slices.Contains(exposed, int(pc.Target)) {
			problems = append(problems, fmt.Sprintf("compose publishes container port %d, the image EXPOSEs %v", pc.Target, exposed))
		}
	}
	if len(app.Ports) == 0 {
		problems = append(problems, "compose publishes no port")
	}
	if app.HealthCheck != nil {
		if u := healthURL(healthArgs(app.HealthCheck.Test)); u != nil && !slices.Contains(exposed, atoi(u.Port())) {
			problems = append(problems, fmt.Sprintf("compose health-checks port %s, the image EXPOSEs %v", u.Port(), exposed))
		}
	}
	return problems
}

func TestComposePortMatchesDockerfileExpose(t *testing.T) {
	dockerfile := readFile(t, dockerfileName)
	compose := readFile(t, composeFile)
	check := func(t *testing.T, compose, dockerfile string) []string {
		t.Helper()
		p, err := loadCompose(t, compose, minimalEnv)
		if err != nil {
			t.Fatal(err)
		}
		_, exposed := checkDockerfile(dockerfile)
		return checkPortsAgree(p, exposed)
	}
	for _, p := range check(t, compose, dockerfile) {
		t.Error(p)
	}
	for _, m := range []struct{ name, compose, dockerfile string }{
		{"compose target", strings.Replace(compose, `127.0.0.1:8080}:8080"`, `127.0.0.1:8080}:9090"`, 1), dockerfile},
		{"dockerfile expose", compose, strings.Replace(dockerfile, "EXPOSE 8080", "EXPOSE 9090", 1)},
	} {
		if m.compose == compose && m.dockerfile == dockerfile {
			t.Fatalf("mutation %q changes nothing: update it", m.name)
		}
		if len(check(t, m.compose, m.dockerfile)) == 0 {
			t.Errorf("mismatched ports (%s) pass", m.name)
		}
	}
}

// checkHealthcheckTool: the compose healthcheck runs inside the image, so
// its program must be installed in the runtime stage.
func checkHealthcheckTool(p *types.Project, dockerfile string) []string {
	app, ok := p.Services[appService]
	if !ok || app.HealthCheck == nil || len(healthArgs(app.HealthCheck.Test)) == 0 {
		return []string{"gpuproxy has no healthcheck command"}
	}
	tool := healthArgs(app.HealthCheck.Test)[0]
	_, stages := parseDockerfile(dockerfile)
	if len(stages) == 0 {
		return []string{"Dockerfile has no stage"}
	}
	final := stages[len(stages)-1]
	if !slices.ContainsFunc(final.instrs, func(in instruction) bool {
		return in.cmd == "RUN" && strings.Contains(in.args, "install") && slices.Contains(strings.Fields(in.args), tool)
	}) {
		return []string{fmt.Sprintf("healthcheck runs %q, which the runtime stage (%s) does not install", tool, final.from)}
	}
	return nil
}

func TestComposeHealthcheckToolInDockerfile(t *testing.T) {
	p, err := loadCompose(t, readFile(t, composeFile), minimalEnv)
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := readFile(t, dockerfileName)
	for _, problem := range checkHealthcheckTool(p, dockerfile) {
		t.Error(problem)
	}
	broken := strings.Replace(dockerfile, " ca-certificates curl", " ca-certificates", 1)
	if broken == dockerfile {
		t.Fatal("mutation changes nothing: update it")
	}
	if len(checkHealthcheckTool(p, broken)) == 0 {
		t.Error("a runtime stage without curl passes")
	}
}

// checkDockerignore: the build context keeps what go build needs and drops
// local state. Patterns are matched at the context root only, which is all
// this file uses.
func checkDockerignore(src string) []string {
	var patterns []string
	for line := range strings.SplitSeq(src, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/"))
		}
	}
	ignored := func(name string) bool {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	var problems []string
	for _, name := range []string{".git", "data", "node_modules", "gpuproxy.db", ".env"} {
		if !ignored(name) {
			problems = append(problems, ".dockerignore does not exclude "+name)
		}
	}
	for _, name := range []string{"go.mod", "go.sum", "cmd", "db", "money.go"} {
		if ignored(name) {
			problems = append(problems, ".dockerignore excludes "+name+", which the build needs")
		}
	}
	return problems
}

func TestDockerfileContextIgnores(t *testing.T) {
	src := readFile(t, ".dockerignore")
	for _, problem := range checkDockerignore(src) {
		t.Error(problem)
	}
	for _, broken := range []string{
		strings.Replace(src, "\n.git\n", "\n", 1),
		strings.Replace(src, "\ndata/\n", "\n", 1),
		src + "*.go\n",
		src + "go.sum\n",
	} {
		if broken == src {
			t.Fatal("mutation changes nothing: update it")
		}
		if len(checkDockerignore(broken)) == 0 {
			t.Errorf("broken .dockerignore passes:\n%s", broken)
		}
	}
}
