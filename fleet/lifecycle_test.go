package fleet_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
)

// logLines returns the JSON log lines in logs whose msg is msg.
func logLines(t *testing.T, logs *teststack.Buffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestLifecycleLogs: created, running and terminated are each logged once
// at info, the last with the final cost: what the meter charges up to the
// stop (exactly price × run time), though no metering tick has run yet.
func TestLifecycleLogs(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{})
			ctx := context.Background()
			logs := &teststack.Buffer{}
			f := fleet.New(w.stores[0], w.guards[0], []providers.Provider{w.vastP[0], w.ioP[0]}, fleet.Options{
				Logger: slog.New(slog.NewJSONHandler(logs, nil)), PollInterval: 40 * time.Millisecond, OfferCacheTTL: -1,
				Leader: w.stores[0].WithLeader, Ledger: billing.NewLedger(w.stores[0], nil)})
			o := w.offer(providers.VastAI, 2)
			inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img:1"})
			if err != nil {
				t.Fatal(err)
			}
			w.waitRunning(f, inst.ID)
			// pace: models time: the instance runs long enough to cost
			// whole micro-dollars (its meter starts when it runs).
			time.Sleep(200 * time.Millisecond)
			got, err := f.Destroy(ctx, w.acct.ID, inst.ID)
			if err != nil || got.Status != gpuproxy.Terminated {
				t.Fatalf("destroy: %+v %v", got, err)
			}
			if _, err := f.Destroy(ctx, w.acct.ID, inst.ID); err != nil { // again: no second line
				t.Fatal(err)
			}
			for _, msg := range []string{"instance created", "instance running", "instance terminated"} {
				ls := logLines(t, logs, msg)
				if len(ls) != 1 || ls[0]["level"] != "INFO" || ls[0]["instance"] != inst.ID || ls[0]["provider"] != providers.VastAI {
					t.Fatalf("%q logged %d times: %v", msg, len(ls), ls)
				}
			}
			term := logLines(t, logs, "instance terminated")[0]
			want := got.PricePerHour.MulMillis(got.TerminatedAt.Sub(got.StartedAt).Milliseconds())
			if want <= 0 || term["final_cost_micros"] != float64(want) || term["final_cost"] != want.String() {
				t.Fatalf("terminated line %v, want final cost %s", term, want)
			}
			// The meter then charges exactly that.
			m := billing.NewMeterer(w.stores[0], billing.MeterOptions{Logger: quiet})
			if _, err := m.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			if v, _ := f.Get(ctx, w.acct.ID, inst.ID); v.CostToDate != want {
				t.Fatalf("cost to date %s, logged final cost %s", v.CostToDate, want)
			}
		})
	}
}
