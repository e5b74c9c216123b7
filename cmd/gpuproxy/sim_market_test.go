package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// vastCall sends a JSON request to a simulated vast.ai and decodes the reply.
func vastCall(t *testing.T, method, u, key, body string) (int, map[string]any) {
	t.Helper()
	r := teststack.SendJSON(t, method, u, body, "Authorization", "Bearer "+key)
	var m map[string]any
	_ = json.Unmarshal(r.Body, &m)
	return r.Status, m
}

// TestSimMarket: `gpuproxy sim --market …` serves a moving vast.ai: bid
// searches answer interruptible rows, a bid instance is preempted at a
// high hazard (paused, status_msg saying so), single-GPU offers refill;
// bad market flags and trace files are refused naming the problem.
func TestSimMarket(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "market.jsonl")
	if err := os.WriteFile(trace, []byte("# prices up 10% after a minute\n"+
		`{"at":"1m","kind":"price","value":1.1}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sim := startSim(t, "--start-delay", "0", "--seed", "7", "--market-tick", "50ms",
		"--preempt-hazard", "3600", "--preempt-hold", "1h", "--min-singles", "3", "--market-trace", trace)
	u, key := sim.env["VASTAI_BASE_URL"], sim.env["VASTAI_API_KEY"]
	search := func(typ, filters string) []any {
		_, m := vastCall(t, "POST", u+"/api/v0/bundles/", key, `{"verified": {"eq": true}, "rentable": {"eq": true}, `+
			filters+`"order": [["dph_total", "asc"]], "type": "`+typ+`", "allocated_storage": 5.0}`)
		rows, _ := m["offers"].([]any)
		return rows
	}
	single4090 := `"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": "1"}, `
	var bid float64
	var id int
	for i := range 5 { // more single 4090s than the floor keeps
		rows := search("bid", single4090)
		if len(rows) < 3 {
			t.Fatalf("after %d rents, %d single 4090s listed; want ≥ 3", i, len(rows))
		}
		row := rows[0].(map[string]any)
		if row["is_bid"] != true {
			t.Fatalf("bid search row: is_bid %v", row["is_bid"])
		}
		bid = row["min_bid"].(float64) * 1.5
		st, m := vastCall(t, "PUT", fmt.Sprintf("%s/api/v0/asks/%.0f/", u, row["id"].(float64)), key,
			fmt.Sprintf(`{"client_id": "me", "image": "img", "disk": 10, "price": %v}`, bid))
		if st != http.StatusOK {
			t.Fatalf("create with a bid: HTTP %d %v", st, m)
		}
		id = int(m["new_contract"].(float64))
	}
	// 3600 an hour on a 50 ms tick: about one tick in twenty preempts.
	var inst map[string]any
	if !testpoll.Wait(20*time.Second, func() bool {
		_, m := vastCall(t, "GET", fmt.Sprintf("%s/api/v0/instances/%d/", u, id), key, "")
		inst, _ = m["instances"].(map[string]any)
		msg, _ := inst["status_msg"].(string)
		return inst["actual_status"] == "stopped" && strings.HasPrefix(msg, "paused: ")
	}) {
		t.Fatalf("no preemption at hazard 3600/h: %v %v", inst["actual_status"], inst["status_msg"])
	}
	if inst["intended_status"] != "running" || inst["is_bid"] != true {
		t.Fatalf("preempted instance: intended %v is_bid %v", inst["intended_status"], inst["is_bid"])
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--price-bound", "2"}, "WalkBound"},
		{[]string{"--preempt-hazard", "-1"}, "Hazard"},
		{[]string{"--market-trace", filepath.Join(t.TempDir(), "none.jsonl")}, "--market-trace"},
		{[]string{"--market-trace", writeTemp(t, "{\"at\":\"1m\",\"kind\":\"nap\"}\n")}, "line 1"},
	} {
		err := run(context.Background(), append([]string{"sim"}, tc.args...), envFunc(nil), strings.NewReader(""),
			io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sim %v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// writeTemp writes text to a new file and returns its path.
func writeTemp(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSandboxMarketRefills: the sandbox's vast.ai keeps two single-GPU
// offers of every model listed however many the README's examples rent
// (issue 32: its MCP example once found only prepaid 4090s left), and
// its bid searches answer interruptible rows.
func TestSandboxMarketRefills(t *testing.T) {
	sims, err := startSimulators(simOptions{startDelay: -1, market: sandboxMarket()})
	if err != nil {
		t.Fatal(err)
	}
	defer sims.Close()
	u, key := sims.vastURL, sims.vastKey
	singles := func(gpu string) []any {
		_, m := vastCall(t, "POST", u+"/api/v0/bundles/", key, `{"verified": {"eq": true}, "external": {"eq": false}, `+
			`"rentable": {"eq": true}, "rented": {"eq": false}, "gpu_name": {"eq": "`+gpu+`"}, "num_gpus": {"eq": "1"}, `+
			`"order": [["dph_total", "asc"]], "type": "on-demand", "allocated_storage": 5.0}`)
		rows, _ := m["offers"].([]any)
		return rows
	}
	for range 8 {
		rows := singles("RTX 4090")
		if len(rows) < 2 {
			t.Fatalf("%d single 4090s listed, want ≥ 2", len(rows))
		}
		st, m := vastCall(t, "PUT", fmt.Sprintf("%s/api/v0/asks/%.0f/", u, rows[0].(map[string]any)["id"].(float64)),
			key, `{"client_id": "me", "image": "img", "disk": 10}`)
		if st != http.StatusOK {
			t.Fatalf("rent: HTTP %d %v", st, m)
		}
	}
	for _, o := range sims.vast.Offers() {
		if n := len(singles(o.GPUName)); n < 2 {
			t.Fatalf("%s: %d single-GPU offers listed, want ≥ 2", o.GPUName, n)
		}
	}
}
