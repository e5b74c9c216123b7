package ionetsim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestFailNextByRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	e.sim.FailNext(2, 429, "GET "+Prefix+"/deployments")
	for i := range 2 {
		if st, body := e.call("GET", Prefix+"/deployments", nil); st != 429 || body["detail"] != "Too Many Requests" {
			t.Fatalf("request %d: %d %v", i, st, body)
		}
	}
	if st, _ := e.call("GET", Prefix+"/hardware/max-gpus-per-container", nil); st != 200 {
		t.Fatal("fault leaked to another route")
	}
	if st, _ := e.call("GET", Prefix+"/deployments", nil); st != 200 {
		t.Fatal("fault outlived its count")
	}
	e.sim.FailNext(1, 503, "")
	if st, body := e.call("GET", Prefix+"/deployments", nil); st != 503 || !strings.Contains(body["_raw"].(string), "503") {
		t.Fatalf("503: %d %v", st, body)
	}
	if n := e.sim.Count("GET " + Prefix + "/deployments"); n != 4 {
		t.Fatalf("count = %d, want 4", n)
	}
}

func TestHangUntilClientTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	e.sim.HangNext(1, Prefix+"/deployments")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+Prefix+"/deployments", nil)
	req.Header.Set("X-API-KEY", testKey)
	start := time.Now()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("hung request answered")
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("hang did not end with the client")
	}
}

func TestAmbiguousDeploys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	e.sim.AmbiguousDeploy(1, AmbiguousReply500)
	if st, body := e.call("POST", Prefix+"/deploy", deployBody("amb-500", 12, 1, 1, 1)); st != 500 || body["_raw"] != "Internal Server Error" {
		t.Fatalf("500 mode: %d %v", st, body)
	}
	e.sim.AmbiguousDeploy(1, AmbiguousDropConnection)
	req, _ := http.NewRequest("POST", e.url+Prefix+"/deploy", strings.NewReader(toJSON(deployBody("amb-drop", 12, 1, 1, 1))))
	req.Header.Set("X-API-KEY", testKey)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("dropped connection answered")
	}
	ds := e.sim.Deployments()
	if len(ds) != 2 || ds[0].Name != "amb-500" || ds[1].Name != "amb-drop" || ds[1].AmountPaid != 300_000 {
		t.Fatalf("ambiguous deploys must still create: %+v", ds)
	}
	e.sim.RejectDeploy(1)
	st, body := e.call("POST", Prefix+"/deploy", deployBody("rej", 12, 1, 1, 1))
	if st != 422 || len(e.sim.Deployments()) != 2 {
		t.Fatalf("reject: %d %v", st, body)
	}
}

func TestRateLimitAndLatency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{})
	for range 5 { // off by default
		if st, _ := e.call("GET", Prefix+"/deployments", nil); st != 200 {
			t.Fatal("rate limited by default")
		}
	}
	e.sim.SetRateLimit(2, time.Hour)
	codes := []int{}
	for range 3 {
		st, _ := e.call("GET", Prefix+"/deployments", nil)
		codes = append(codes, st)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("codes %v", codes)
	}
	e.sim.SetRateLimit(0, 0)
	e.sim.SetLatency(40 * time.Millisecond)
	start := time.Now()
	e.call("GET", Prefix+"/deployments", nil)
	if time.Since(start) < 40*time.Millisecond {
		t.Fatal("latency not applied")
	}
	e.sim.ClearFaults()
}
