package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
)

// simProc is an in-process `gpuproxy sim`.
type simProc struct {
	env    map[string]string // the four printed variables
	stdout string            // everything it printed
	cancel context.CancelFunc
	done   chan error
}

var simLineRE = regexp.MustCompile(`^(VASTAI_BASE_URL=http://127\.0\.0\.1:\d+|VASTAI_API_KEY=\S+|IONET_BASE_URL=http://127\.0\.0\.1:\d+|IONET_API_KEY=\S+)$`)

// startSim runs `gpuproxy sim args...` and reads its stdout to the end (the
// sim closes it after the four lines), as a shell's "$(...)" would.
func startSim(t *testing.T, args ...string) *simProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	p := &simProc{env: map[string]string{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := run(ctx, append([]string{"sim"}, args...), envFunc(nil), strings.NewReader(""), pw, io.Discard)
		_ = pw.CloseWithError(fmt.Errorf("sim exited: %v", err))
		p.done <- err
	}()
	t.Cleanup(p.stop(t))
	read := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(pr); read <- b }()
	select {
	case b := <-read:
		p.stdout = string(b)
	case <-time.After(15 * time.Second):
		t.Fatal("sim did not close its stdout")
	}
	lines := strings.Split(strings.TrimSuffix(p.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("sim printed %q, want exactly four lines", p.stdout)
	}
	for i, want := range []string{"VASTAI_BASE_URL", "VASTAI_API_KEY", "IONET_BASE_URL", "IONET_API_KEY"} {
		k, v, _ := strings.Cut(lines[i], "=")
		if k != want || !simLineRE.MatchString(lines[i]) {
			t.Fatalf("line %d is %q, want %s=…", i+1, lines[i], want)
		}
		p.env[k] = v
	}
	return p
}

// stop ends the sim as SIGTERM would and checks it exits cleanly.
func (p *simProc) stop(t *testing.T) func() {
	return func() {
		p.cancel()
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("sim returned %v", err)
			}
			p.done <- err // for a second stop
		case <-time.After(10 * time.Second):
			t.Error("sim did not stop")
		}
	}
}

// TestSimSharedByReplicas runs `gpuproxy sim` and `serve` replicas pointed
// at it through the printed environment, as separate deployments would:
// offers from both providers, a vast.ai and an io.net instance created on
// one replica, proxied to and destroyed through another. On Postgres a
// third replica without proxy.allow_networks refuses to proxy to the
// simulated instances on loopback.
func TestSimSharedByReplicas(t *testing.T) {
	sim := startSim(t, "--listen", "127.0.0.1:0", "--start-delay", "300ms")
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			env := map[string]string{"GPUPROXY_LOG_LEVEL": "warn"}
			for name, v := range sim.env {
				env[name] = v
			}
			env["DATABASE_URL"] = testDatabaseURL(t, k, "sim.db")
			replicas := 1
			if k == dbtest.Postgres {
				replicas = 3
			}
			cli(t, env, "accounts", "create", "acme")
			key := lastLine(cli(t, env, "keys", "create", "--account", "acme", "--preset", "engineer"))
			cli(t, env, "credits", "add", "--account", "acme", "--amount", "100")

			var bases []string
			for i := range replicas {
				renv := map[string]string{}
				for n, v := range env {
					renv[n] = v
				}
				if i < 2 {
					renv["GPUPROXY_PROXY_ALLOW_NETWORKS"] = "127.0.0.0/8"
				}
				ctx, cancel := context.WithCancel(context.Background())
				stdout := &syncBuffer{}
				done := make(chan error, 1)
				go func() {
					done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, envFunc(renv), strings.NewReader(""), stdout, io.Discard)
				}()
				bases = append(bases, waitListening(t, stdout, done))
				t.Cleanup(func() {
					cancel()
					select {
					case err := <-done:
						if err != nil {
							t.Errorf("serve returned %v", err)
						}
					case <-time.After(25 * time.Second):
						t.Error("serve did not shut down")
					}
				})
			}
			a := client{t: t, base: bases[0]}
			b := a
			if len(bases) > 1 {
				b.base = bases[1]
			}

			ids := map[string]string{}
			for _, prov := range []string{"vast.ai", "io.net"} {
				st, o := a.call("GET", "/api/v1/gpu/offers?provider="+prov+"&max_price=1&limit=1", key, "")
				list, _ := o["offers"].([]any)
				if st != 200 || len(list) != 1 || len(o["errors"].([]any)) != 0 {
					t.Fatalf("%s offers: %d %v", prov, st, o)
				}
				off := list[0].(map[string]any)
				body := `{"provider":"` + prov + `","offer_id":"` + off["offer_id"].(string) + `","image":"vllm/vllm-openai:latest","hours":1}`
				if prov == "vast.ai" {
					body = `{"provider":"` + prov + `","offer_id":"` + off["offer_id"].(string) + `","image":"vllm/vllm-openai:latest"}`
				}
				st, inst := a.call("POST", "/api/v1/gpu/instances", key, body, "Idempotency-Key", "sim-"+prov)
				if st != 201 {
					t.Fatalf("%s create: %d %v", prov, st, inst)
				}
				ids[prov] = inst["id"].(string)
			}
			for prov, id := range ids {
				var inst map[string]any
				testpoll.WaitEvery(20*time.Second, 100*time.Millisecond, func() bool {
					_, inst = b.call("GET", "/api/v1/gpu/instances/"+id, key, "")
					return inst["status"] == "running"
				})
				if inst["status"] != "running" || !strings.HasPrefix(inst["endpoint"].(string), "http://127.0.0.1:") {
					t.Fatalf("%s instance not running: %v", prov, inst)
				}
				st, chat := b.call("POST", "/api/v1/proxy/"+id+"/v1/chat/completions", key,
					`{"model":"x","messages":[{"role":"user","content":"ping"}]}`)
				if st != 200 || len(chat["choices"].([]any)) != 1 {
					t.Fatalf("%s proxied chat: %d %v", prov, st, chat)
				}
				if len(bases) > 2 {
					c := client{t: t, base: bases[2]}
					st, e := c.call("GET", "/api/v1/proxy/"+id+"/v1/models", key, "")
					det, _ := e["error"].(map[string]any)["details"].(map[string]any)
					if st != 403 || det["address_class"] != "loopback" {
						t.Fatalf("%s without allow_networks: %d %v", prov, st, e)
					}
				}
			}
			for prov, id := range ids {
				st, inst := b.call("DELETE", "/api/v1/gpu/instances/"+id, key, "")
				if st != 200 || inst["status"] != "terminated" && inst["status"] != "terminating" {
					t.Fatalf("%s delete: %d %v", prov, st, inst)
				}
				// io.net takes a moment to confirm a destroyed deployment.
				testpoll.WaitEvery(20*time.Second, 100*time.Millisecond, func() bool {
					if inst["status"] != "terminated" {
						_, inst = a.call("GET", "/api/v1/gpu/instances/"+id, key, "")
					}
					return inst["status"] == "terminated"
				})
				if inst["status"] != "terminated" {
					t.Fatalf("%s not terminated: %v", prov, inst)
				}
			}
		})
	}
}

// TestSimFlags: a fixed port (vast.ai on it, io.net on the next), fixed
// keys, --env-file, and refusals of bad flags.
func TestSimFlags(t *testing.T) {
	dir := t.TempDir()
	envPath := filepath.Join(dir, "sim.env")
	var sim *simProc
	var port int
	for try := 0; sim == nil; try++ {
		port = freePortPair(t)
		var err error
		sim, err = runSimUntilPrinted(t, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--vastai-key", "vk",
			"--ionet-key", "ik", "--env-file", envPath)
		if err != nil && (try == 4 || !strings.Contains(err.Error(), "address already in use")) {
			t.Fatalf("sim: %v", err)
		}
	}
	t.Cleanup(sim.stop(t))
	want := fmt.Sprintf("VASTAI_BASE_URL=http://127.0.0.1:%d\nVASTAI_API_KEY=vk\nIONET_BASE_URL=http://127.0.0.1:%d\nIONET_API_KEY=ik\n", port, port+1)
	if sim.stdout != want {
		t.Fatalf("stdout %q, want %q", sim.stdout, want)
	}
	if b, err := os.ReadFile(envPath); err != nil || string(b) != want {
		t.Fatalf("env file: %q %v", b, err)
	}
	if fi, err := os.Stat(envPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("env file mode: %v %v", fi, err)
	}
	// Both answer the fixed keys, and only those, in their own wire formats.
	for _, c := range []struct {
		url, header, value string
		status             int
	}{
		{fmt.Sprintf("http://127.0.0.1:%d/api/v0/users/current/", port), "Authorization", "Bearer vk", 200},
		{fmt.Sprintf("http://127.0.0.1:%d/api/v0/users/current/", port), "Authorization", "Bearer ik", 401},
		{fmt.Sprintf("http://127.0.0.1:%d/enterprise/v1/io-cloud/caas/deployments", port+1), "X-API-KEY", "ik", 200},
		{fmt.Sprintf("http://127.0.0.1:%d/enterprise/v1/io-cloud/caas/deployments", port+1), "X-API-KEY", "vk", 401},
	} {
		req, _ := http.NewRequest("GET", c.url, nil)
		req.Header.Set(c.header, c.value)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(res.Body).ReadString('\n')
		res.Body.Close()
		if res.StatusCode != c.status {
			t.Fatalf("%s with %s: %d %s, want %d", c.url, c.value, res.StatusCode, line, c.status)
		}
	}

	for _, args := range [][]string{
		{"--listen", "nope"}, {"--listen", "127.0.0.1:65535"}, {"--start-delay", "-1s"}, {"extra"},
		{"--env-file", filepath.Join(dir, "missing", "sim.env")},
		{"--offer-churn", "1.5"}, {"--offer-churn", "-0.1"}, {"--offer-churn", "NaN"}, {"--offer-churn", "lots"},
	} {
		err := run(context.Background(), append([]string{"sim"}, args...), envFunc(nil), strings.NewReader(""),
			io.Discard, io.Discard)
		if err == nil {
			t.Errorf("sim %v succeeded", args)
		} else if args[0] == "--offer-churn" && !strings.Contains(err.Error(), "offer-churn") {
			t.Errorf("sim %v: %v, want an error naming --offer-churn", args, err)
		}
	}
	err := run(context.Background(), []string{"sim", "--offer-churn", "1.5"}, envFunc(nil), strings.NewReader(""),
		io.Discard, io.Discard)
	if err == nil || err.Error() != "sim: --offer-churn must be between 0 and 1, got 1.5" {
		t.Errorf("--offer-churn 1.5: %v", err)
	}
}

// vastSearch lists the ask ids of the vast.ai simulator at base with the
// official client's default search.
func vastSearch(t *testing.T, base, key string) []float64 {
	t.Helper()
	r := teststack.SendJSON(t, "POST", base+"/api/v0/bundles/", `{"verified":{"eq":true},"external":{"eq":false},`+
		`"rentable":{"eq":true},"rented":{"eq":false},"order":[["score","desc"]],"type":"on-demand","limit":1000}`,
		"Authorization", "Bearer "+key)
	var body struct {
		Offers []struct {
			ID float64 `json:"id"`
		} `json:"offers"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil || r.Status != http.StatusOK {
		t.Fatalf("vast.ai search: HTTP %d %s", r.Status, r.Body)
	}
	ids := make([]float64, 0, len(body.Offers))
	for _, o := range body.Offers {
		ids = append(ids, o.ID)
	}
	return ids
}

// vastRent creates an instance on ask id and returns the HTTP status.
func vastRent(t *testing.T, base, key string, id float64) int {
	t.Helper()
	return teststack.SendJSON(t, "PUT", fmt.Sprintf("%s/api/v0/asks/%.0f/", base, id),
		`{"client_id":"me","image":"img","disk":10}`, "Authorization", "Bearer "+key).Status
}

// takenSince returns an id listed in before and missing from after.
func takenSince(before, after []float64) (float64, bool) {
	for _, id := range before {
		if !slices.Contains(after, id) {
			return id, true
		}
	}
	return 0, false
}

// TestSimOfferChurn: `gpuproxy sim --offer-churn 0.3` serves both
// simulators with churn: offers a vast.ai search listed are taken (a
// create on one answers 410), and io.net's offers go too.
func TestSimOfferChurn(t *testing.T) {
	sim := startSim(t, "--offer-churn", "0.3", "--start-delay", "0")
	vURL, vKey := sim.env["VASTAI_BASE_URL"], sim.env["VASTAI_API_KEY"]
	first := vastSearch(t, vURL, vKey)
	gone, ok := takenSince(first, vastSearch(t, vURL, vKey))
	if !ok {
		t.Fatal("vast.ai: no listed offer was taken at churn 0.3")
	}
	if st := vastRent(t, vURL, vKey, gone); st != http.StatusGone {
		t.Fatalf("vast.ai create on a taken offer: HTTP %d, want 410", st)
	}

	a := ionet.New(ionet.Options{BaseURL: sim.env["IONET_BASE_URL"], APIKey: sim.env["IONET_API_KEY"]})
	ids := func() []string {
		offers, err := a.Search(context.Background(), providers.SearchFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range offers {
			out = append(out, o.ID)
		}
		return out
	}
	before := ids()
	after := ids()
	lost := false
	for _, id := range before {
		lost = lost || !slices.Contains(after, id)
	}
	if !lost {
		t.Fatalf("io.net: no offer taken at churn 0.3 (%d listed, then %d)", len(before), len(after))
	}
}

// TestSandboxOfferChurn: serve --sandbox runs vast.ai with
// sandboxOfferChurn once one instance exists: the first create of a listed
// offer always works, later searches lose offers to someone else.
func TestSandboxOfferChurn(t *testing.T) {
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "churn.db")
	env := map[string]string{"DATABASE_URL": dbURL, "GPUPROXY_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	stdout := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, io.Discard)
	}()
	defer func() { cancel(); <-done }()
	waitListening(t, stdout, done)
	var st sandboxState
	if !testpoll.Wait(10*time.Second, func() bool { var ok bool; st, ok = sandboxFor(dbURL); return ok }) {
		t.Fatal("the sandbox never published its state")
	}
	vURL, vKey := st.VastAIURL, st.VastAIKey
	listed := vastSearch(t, vURL, vKey)
	if again := vastSearch(t, vURL, vKey); !slices.Equal(listed, again) {
		t.Fatal("offers taken before the first create")
	}
	if code := vastRent(t, vURL, vKey, listed[0]); code != http.StatusOK {
		t.Fatalf("first create in the sandbox: HTTP %d", code)
	}
	before := vastSearch(t, vURL, vKey)
	gone, ok := takenSince(before, vastSearch(t, vURL, vKey))
	if !ok {
		t.Fatalf("no offer taken at churn %v after the first create", sandboxOfferChurn)
	}
	if code := vastRent(t, vURL, vKey, gone); code != http.StatusGone {
		t.Fatalf("create on a taken offer: HTTP %d, want 410", code)
	}
}

// runSimUntilPrinted runs `gpuproxy sim args...` with a stdout that is not
// closed, until it has printed four lines; err is set if it exits first.
func runSimUntilPrinted(t *testing.T, args ...string) (*simProc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	p := &simProc{cancel: cancel, done: make(chan error, 1)}
	go func() {
		p.done <- run(ctx, append([]string{"sim"}, args...), envFunc(nil), strings.NewReader(""), out, io.Discard)
	}()
	var exited error
	if testpoll.Wait(10*time.Second, func() bool {
		select {
		case err := <-p.done:
			exited = fmt.Errorf("exited: %w", err)
			return true
		default:
		}
		p.stdout = out.String()
		return strings.Count(p.stdout, "\n") >= 4
	}) {
		if exited != nil {
			cancel()
			return nil, exited
		}
		return p, nil
	}
	cancel()
	<-p.done
	return nil, fmt.Errorf("printed only %q", out.String())
}

// freePortPair returns a port p such that p and p+1 were free a moment ago.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no free port pair")
	return 0
}

// TestConfigAllowNetworks: proxy.allow_networks from the file and
// GPUPROXY_PROXY_ALLOW_NETWORKS (which replaces it); a bad CIDR is an
// error naming the setting; --sandbox adds loopback.
func TestConfigAllowNetworks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gpuproxy.yaml")
	pfx := func(ps ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	for _, tc := range []struct {
		name, yaml, env string
		want            []netip.Prefix
		err             string // substring of the error, if any
	}{
		{name: "default", want: nil},
		{name: "yaml", yaml: "proxy:\n  allow_networks: [10.8.0.0/16, 'fd00:1::/64']\n", want: pfx("10.8.0.0/16", "fd00:1::/64")},
		{name: "yaml block list", yaml: "proxy:\n  allow_networks:\n    - 100.64.0.0/10\n", want: pfx("100.64.0.0/10")},
		{name: "env", env: "10.0.0.0/8, 192.168.0.0/16,", want: pfx("10.0.0.0/8", "192.168.0.0/16")},
		{name: "env replaces yaml", yaml: "proxy:\n  allow_networks: [10.8.0.0/16]\n", env: "172.16.0.0/12",
			want: pfx("172.16.0.0/12")},
		{name: "yaml bad", yaml: "proxy:\n  allow_networks: [10.0.0.0/33]\n", err: `proxy.allow_networks: "10.0.0.0/33"`},
		{name: "yaml bare address", yaml: "proxy:\n  allow_networks: [10.0.0.1]\n", err: "proxy.allow_networks"},
		{name: "env bad", env: "10.0.0.0/8,vpn", err: `GPUPROXY_PROXY_ALLOW_NETWORKS: "vpn" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ""
			if tc.yaml != "" {
				if err := writeFile(path, tc.yaml); err != nil {
					t.Fatal(err)
				}
				p = path
			}
			c, err := loadConfig(p, envFunc(map[string]string{"GPUPROXY_PROXY_ALLOW_NETWORKS": tc.env}))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Proxy.networks(false); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("networks = %v, want %v", got, tc.want)
			}
			want := append(append([]netip.Prefix(nil), tc.want...), pfx("127.0.0.0/8", "::1/128")...)
			if got := c.Proxy.networks(true); !reflect.DeepEqual(got, want) {
				t.Fatalf("sandbox networks = %v, want %v", got, want)
			}
		})
	}
}
