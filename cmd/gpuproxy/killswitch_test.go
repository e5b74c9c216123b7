package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// micros reads a JSON USD amount (at most 6 decimal places) exactly.
func micros(v any) int64 { f, _ := v.(float64); return int64(math.Round(f * 1e6)) }

// TestSandboxKillSwitch is the "done when": `serve --sandbox` with
// GPUPROXY_METERING_INTERVAL=1s and GPUPROXY_HORIZON=10s, an account whose
// 60-minute limit is 20 seconds of its vast.ai instance's price and whose
// on_exceed is destroy. Nobody destroys the instance but the service, and
// the window's spend, once the final charge is metered, is at or under the
// limit. The test logs how far under (µ$ and seconds).
func TestSandboxKillSwitch(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			// No rate limit: the test polls its instance closely.
			env := map[string]string{"GPUPROXY_METERING_INTERVAL": "1s", "GPUPROXY_HORIZON": "10s", "GPUPROXY_LOG_LEVEL": "warn",
				"GPUPROXY_RATE_LIMIT": "0"}
			env["DATABASE_URL"] = testDatabaseURL(t, k, "sb.db")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stdout, stderr := &syncBuffer{}, &syncBuffer{}
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env), strings.NewReader(""), stdout, stderr)
			}()
			base := waitListening(t, stdout, done)
			admin, api := sandboxKeys(t, stdout)
			c := client{t: t, base: base}

			// The dearest vast.ai offer up to $10/hour: a micro-dollar is then
			// well under a second of its time.
			_, offers := c.call("GET", "/api/v1/gpu/offers?provider=vast.ai&max_price=10&limit=500", api, "")
			var offer map[string]any
			for _, o := range offers["offers"].([]any) {
				if om := o.(map[string]any); offer == nil || micros(om["price_per_hour"]) > micros(offer["price_per_hour"]) {
					offer = om
				}
			}
			price := micros(offer["price_per_hour"])
			limit := price * 20 / 3600 // 20 seconds of the instance, rounded down
			st, lim := c.call("PUT", "/api/v1/accounts/demo/limits", admin,
				fmt.Sprintf(`{"windows":[{"window_minutes":60,"limit":%d.%06d}],"on_exceed":"destroy"}`, limit/1e6, limit%1e6))
			if st != 200 {
				t.Fatalf("limits: %d %v", st, lim)
			}
			st, inst := c.call("POST", "/api/v1/gpu/instances", api,
				`{"provider":"vast.ai","offer_id":"`+offer["offer_id"].(string)+`","image":"vllm/vllm-openai:latest"}`)
			if st != 201 {
				t.Fatalf("create: %d %v", st, inst)
			}
			id := inst["id"].(string)
			testpoll.WaitEvery(60*time.Second, 100*time.Millisecond, func() bool {
				_, inst = c.call("GET", "/api/v1/gpu/instances/"+id, api, "")
				return inst["status"] == "terminated"
			})
			if inst["status"] != "terminated" || inst["started_at"] == nil {
				t.Fatalf("the service did not destroy the instance: %v", inst)
			}
			started, _ := time.Parse(time.RFC3339Nano, inst["started_at"].(string))
			stopped, _ := time.Parse(time.RFC3339Nano, inst["terminated_at"].(string))
			// The final charge runs to the termination: wait until it is metered.
			final := price * stopped.Sub(started).Milliseconds() / 3_600_000
			testpoll.WaitEvery(10*time.Second, 100*time.Millisecond, func() bool {
				_, inst = c.call("GET", "/api/v1/gpu/instances/"+id, api, "")
				return micros(inst["cost_to_date"]) == final
			})
			if got := micros(inst["cost_to_date"]); got != final {
				t.Fatalf("instance charged %d µ$, want %d µ$ for %v", got, final, stopped.Sub(started))
			}
			st, sp := c.call("GET", "/api/v1/spending", api, "")
			if st != 200 {
				t.Fatalf("spending: %d %v", st, sp)
			}
			spent := micros(sp["windows"].([]any)[0].(map[string]any)["spent"])
			ran := stopped.Sub(started)
			under := limit - spent
			t.Logf("%s: price %d µ$/h, limit %d µ$ (20 s); spent %d µ$, ran %.3f s: under the limit by %d µ$ = %.3f s of the instance",
				k, price, limit, spent, ran.Seconds(), under, float64(under)*3600/float64(price))
			if spent > limit {
				t.Fatalf("spent %d µ$ passes the limit %d µ$ by %.3f s of the instance", spent, limit, float64(-under)*3600/float64(price))
			}
			if !strings.Contains(stderr.String(), "kill switch") {
				t.Fatalf("no kill switch log line: %s", stderr.String())
			}
			res, err := http.Get(base + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if !strings.Contains(string(b), "gpuproxy_kill_switch_destroys_total 1") {
				t.Fatal("metrics: no gpuproxy_kill_switch_destroys_total 1")
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(25 * time.Second):
				t.Fatal("no shutdown")
			}
		})
	}
}
