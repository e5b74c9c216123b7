package alerts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
)

// TestLifetimeKindsAreTheFleets: the kinds alerts spells are the fleet's
// (alerts does not import the fleet; the app passes fleet.LifetimeEvent's
// kind through).
func TestLifetimeKindsAreTheFleets(t *testing.T) {
	t.Parallel()
	for _, c := range [][2]string{
		{alerts.LifetimeIdleWarning, fleet.EventIdleWarning}, {alerts.LifetimeExpiring, fleet.EventExpiring},
		{alerts.LifetimeStopped, fleet.EventStopped}, {alerts.LifetimeDestroyed, fleet.EventDestroyed},
	} {
		if c[0] != c[1] {
			t.Errorf("alerts spells %q, the fleet %q", c[0], c[1])
		}
	}
}

// lifetimeInstance is a running vast.ai instance of account 7 with every
// rule: started 11:30, last request 12:00, idle_timeout 30m.
func lifetimeInstance() gpuproxy.Instance {
	return gpuproxy.Instance{ID: "gpi_0123abcd", AccountID: 7, Provider: "vastai", GPUName: "RTX 4090", NumGPUs: 1,
		Status: gpuproxy.Running, StartedAt: time.Date(2026, 11, 25, 11, 30, 0, 0, time.UTC),
		LastActivityAt: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC),
		Lifetime: gpuproxy.Lifetime{MaxDuration: 8 * time.Hour, IdleTimeout: 30 * time.Minute, IdleAction: gpuproxy.IdleStop,
			IdleGrace: 10 * time.Minute, SpendCap: 50 * usd}}
}

// TestLifetimePayload: each kind's body names the instance, its rule and
// action, when it acts or acted, its last activity, and says it in a
// sentence.
func TestLifetimePayload(t *testing.T) {
	t.Parallel()
	inst := lifetimeInstance()
	at := func(h, m, s int) time.Time { return time.Date(2026, 11, 25, h, m, s, 0, time.UTC) }
	for _, c := range []struct {
		n       alerts.LifetimeNotice
		action  string
		text    string
		acts    bool
		idleSet bool
	}{
		{alerts.LifetimeNotice{Kind: alerts.LifetimeIdleWarning, Instance: inst, Rule: gpuproxy.RuleIdle,
			Action: gpuproxy.IdleStop, At: at(12, 30, 0)}, "stop",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme idles since 12:00 UTC; it will be " +
				"stopped at 12:30 UTC (idle_timeout 30m). A proxied request or POST " +
				"/api/v1/gpu/instances/gpi_0123abcd/keepalive keeps it.", true, true},
		{alerts.LifetimeNotice{Kind: alerts.LifetimeExpiring, Instance: inst, Rule: gpuproxy.RuleMaxDuration,
			Action: gpuproxy.IdleDestroy, At: at(19, 30, 0)}, "destroy",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme runs since 11:30 UTC; it will be " +
				"destroyed at 19:30 UTC (max_duration 8h).", true, false},
		{alerts.LifetimeNotice{Kind: alerts.LifetimeExpiring, Instance: inst, Rule: gpuproxy.RuleSpendCap,
			Action: gpuproxy.IdleDestroy, At: at(14, 2, 17)}, "destroy",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme will be destroyed at 14:02:17 UTC, " +
				"before its cost passes its spend_cap of $50.00.", true, false},
		{alerts.LifetimeNotice{Kind: alerts.LifetimeStopped, Instance: inst, Rule: gpuproxy.RuleIdle,
			Action: gpuproxy.IdleStop, At: at(12, 30, 4)}, "stop",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme was stopped at 12:30:04 UTC by its " +
				"idle_timeout (30m; idle since 12:00 UTC). Its disk is kept; gpuproxy bills it no more (the provider " +
				"may bill the storage).", false, true},
		{alerts.LifetimeNotice{Kind: alerts.LifetimeDestroyed, Instance: inst, Rule: gpuproxy.RuleMaxDuration,
			Action: gpuproxy.IdleDestroy, At: at(19, 30, 1)}, "destroy",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme was destroyed at 19:30:01 UTC by its " +
				"max_duration (8h; running since 11:30 UTC).", false, false},
		// An idle rule on a provider that cannot stop destroys: the
		// action event says what was done.
		{alerts.LifetimeNotice{Kind: alerts.LifetimeDestroyed, Instance: inst, Rule: gpuproxy.RuleIdle,
			Action: gpuproxy.IdleStop, At: at(12, 30, 0)}, "destroy",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme was destroyed at 12:30 UTC by its " +
				"idle_timeout (30m; idle since 12:00 UTC).", false, true},
		{alerts.LifetimeNotice{Kind: alerts.LifetimeDestroyed, Instance: inst, Rule: gpuproxy.RuleSpendCap,
			Action: gpuproxy.IdleDestroy, At: at(14, 0, 0)}, "destroy",
			"gpuproxy: instance gpi_0123abcd (RTX 4090 on vastai) of account acme was destroyed at 14:00 UTC by its " +
				"spend_cap ($50.00).", false, false},
	} {
		t.Run(c.n.Kind+"/"+string(c.n.Rule), func(t *testing.T) {
			recorded := at(12, 25, 0)
			ev, err := alerts.LifetimeEvent(7, "acme", c.n, recorded)
			if err != nil {
				t.Fatal(err)
			}
			var p alerts.Payload
			if err := json.Unmarshal(ev.Body, &p); err != nil {
				t.Fatal(err)
			}
			if p.Text != c.text {
				t.Errorf("text\n got %s\nwant %s", p.Text, c.text)
			}
			if !strings.HasPrefix(p.ID, "evt_") || p.ID != ev.ID || p.Type != c.n.Kind || ev.Kind != c.n.Kind ||
				ev.AccountID != 7 || ev.InstanceID != inst.ID || !ev.At.Equal(recorded) || !p.CreatedAt.Equal(recorded) ||
				p.Account != "acme" || p.InstanceID != inst.ID || p.Provider != "vastai" || p.GPUName != "RTX 4090" ||
				p.NumGPUs != 1 || p.Rule != string(c.n.Rule) || p.Action != c.action ||
				p.LastActivityAt == nil || !p.LastActivityAt.Equal(inst.LastActivityAt) ||
				p.StartedAt == nil || !p.StartedAt.Equal(inst.StartedAt) ||
				p.MaxDuration != "8h0m0s" || p.IdleTimeout != "30m0s" || p.SpendCap == nil || *p.SpendCap != 50*usd {
				t.Errorf("payload %+v\n%s", p, ev.Body)
			}
			if c.acts && (p.ActsAt == nil || !p.ActsAt.Equal(c.n.At) || p.ActedAt != nil) ||
				!c.acts && (p.ActedAt == nil || !p.ActedAt.Equal(c.n.At) || p.ActsAt != nil) {
				t.Errorf("acts_at %v acted_at %v, want %v (warning: %v)", p.ActsAt, p.ActedAt, c.n.At, c.acts)
			}
			if c.idleSet != (p.IdleSince != nil) || c.idleSet && !p.IdleSince.Equal(inst.LastActivityAt) {
				t.Errorf("idle_since %v", p.IdleSince)
			}
			// Budget fields stay out of a lifetime event's body.
			for _, f := range []string{`"window"`, `"window_minutes"`, `"threshold"`, `"cost"`, `"key_id"`} {
				if strings.Contains(string(ev.Body), f) {
					t.Errorf("body has %s: %s", f, ev.Body)
				}
			}
		})
	}
	// Without a request yet, idleness counts from the start plus the grace,
	// and a period begun on another day says its date.
	n := alerts.LifetimeNotice{Kind: alerts.LifetimeStopped, Instance: inst, Rule: gpuproxy.RuleIdle,
		Action: gpuproxy.IdleStop, At: at(12, 10, 0).Add(24 * time.Hour)}
	n.Instance.LastActivityAt, n.Instance.NumGPUs = time.Time{}, 2
	ev, err := alerts.LifetimeEvent(7, "acme", n, n.At)
	if err != nil {
		t.Fatal(err)
	}
	var p alerts.Payload
	if err := json.Unmarshal(ev.Body, &p); err != nil {
		t.Fatal(err)
	}
	const want = "gpuproxy: instance gpi_0123abcd (2x RTX 4090 on vastai) of account acme was stopped at 12:10 UTC by " +
		"its idle_timeout (30m; idle since 2026-11-25 11:40 UTC)."
	if !strings.HasPrefix(p.Text, want) || p.LastActivityAt != nil || strings.Contains(string(ev.Body), "last_activity_at") ||
		p.IdleSince == nil || !p.IdleSince.Equal(at(11, 40, 0)) {
		t.Errorf("no activity: %s", ev.Body)
	}
	// What an event cannot be made of is refused.
	for _, bad := range []alerts.LifetimeNotice{
		{Kind: "instance.exploded", Instance: inst, Rule: gpuproxy.RuleIdle, At: at(12, 0, 0)},
		{Kind: alerts.LifetimeStopped, Rule: gpuproxy.RuleIdle, At: at(12, 0, 0)},
		{Kind: alerts.LifetimeStopped, Instance: inst, At: at(12, 0, 0)},
		{Kind: alerts.LifetimeStopped, Instance: inst, Rule: gpuproxy.RuleIdle},
	} {
		if _, err := alerts.LifetimeEvent(7, "acme", bad, at(12, 0, 0)); err == nil {
			t.Errorf("LifetimeEvent(%+v) made an event", bad)
		}
	}
}

// TestLifetimeEventsOnce: every replica reporting the same warnings and
// actions (as replicas' fleets would if two decided at once) sends each
// once, signed, with its kind in the headers; a new idle period warns
// anew; an account without a webhook gets nothing, not even after it sets
// one.
func TestLifetimeEventsOnce(t *testing.T) {
	for _, c := range []struct {
		kind     dbtest.Kind
		replicas int
	}{{dbtest.Postgres, 3}, {dbtest.SQLite, 2}} {
		t.Run(string(c.kind), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rcv := newReceiver(t)
			st := newStack(t, c.kind, c.replicas, fastOptions(t))
			_, secret, err := st.svcs[0].Set(ctx, st.acct.ID, rcv.URL+"/hook", []float64{5}, false) // no crossing
			if err != nil {
				t.Fatal(err)
			}
			rcv.secret.Store(secret)
			quiet, err := st.stores[0].CreateAccount(ctx, "quiet", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			st.run(t)

			idle := lifetimeInstance()
			idle.AccountID = st.acct.ID
			expiring := idle
			expiring.ID = "gpi_expiring"
			acts := idle.LastActivityAt.Add(idle.Lifetime.IdleTimeout)
			notices := []alerts.LifetimeNotice{
				{Kind: alerts.LifetimeIdleWarning, Instance: idle, Rule: gpuproxy.RuleIdle, Action: gpuproxy.IdleStop, At: acts},
				{Kind: alerts.LifetimeStopped, Instance: idle, Rule: gpuproxy.RuleIdle, Action: gpuproxy.IdleStop, At: acts},
				{Kind: alerts.LifetimeExpiring, Instance: expiring, Rule: gpuproxy.RuleSpendCap, Action: gpuproxy.IdleDestroy,
					At: acts},
				{Kind: alerts.LifetimeDestroyed, Instance: expiring, Rule: gpuproxy.RuleSpendCap, Action: gpuproxy.IdleDestroy,
					At: acts},
			}
			var wg sync.WaitGroup
			for i, s := range st.svcs {
				wg.Go(func() {
					for r := range 3 {
						for _, n := range notices {
							// Replicas disagree on the spend cap's acting time
							// (it moves with the spend rate) and on when they
							// acted: still one event each.
							n.At = n.At.Add(time.Duration(i*3+r) * time.Second)
							if n.Kind == alerts.LifetimeIdleWarning {
								n.At = acts
							}
							s.Lifetime(n)
							q := n
							q.Instance.AccountID = quiet.ID
							s.Lifetime(q)
						}
					}
				})
			}
			wg.Wait()
			// A request at 12:10 began a new idle period: a new warning.
			again := notices[0]
			again.Instance.LastActivityAt = again.Instance.LastActivityAt.Add(10 * time.Minute)
			again.At = again.At.Add(10 * time.Minute)
			st.svcs[c.replicas-1].Lifetime(again)
			// Each replica's hook worker is first in, first out: once its
			// own last event is recorded, every earlier one was handled.
			for i, s := range st.svcs {
				last := alerts.LifetimeNotice{Kind: alerts.LifetimeDestroyed, Instance: idle, Rule: gpuproxy.RuleMaxDuration,
					Action: gpuproxy.IdleDestroy, At: acts}
				last.Instance.ID = fmt.Sprintf("gpi_last%d", i)
				s.Lifetime(last)
			}
			want := len(notices) + 1 + c.replicas
			waitFor(t, 20*time.Second, "every replica's last event delivered", func() bool {
				ds, err := st.svcs[0].Deliveries(ctx, st.acct.ID, gpuproxy.AlertDelivered, 0, 500)
				last := 0
				for _, d := range ds {
					if strings.HasPrefix(d.Event.InstanceID, "gpi_last") {
						last++
					}
				}
				return err == nil && last == c.replicas
			})
			// The account that had no webhook sets one now: past events
			// were never recorded, so none comes.
			if _, _, err := st.svcs[0].Set(ctx, quiet.ID, rcv.URL+"/quiet", nil, false); err != nil {
				t.Fatal(err)
			}
			st.observed(t, 20) // many more send rounds on every replica
			if ds, err := st.svcs[0].Deliveries(ctx, quiet.ID, "", 0, 100); err != nil || len(ds) != 0 {
				t.Fatalf("the account without a webhook has %d deliveries (%v)", len(ds), err)
			}
			ds, err := st.svcs[1].Deliveries(ctx, st.acct.ID, "", 0, 500)
			if err != nil || len(ds) != want {
				t.Fatalf("%d deliveries (%v), want %d", len(ds), err, want)
			}
			posts := rcv.got()
			if len(posts) != want {
				for _, p := range posts {
					t.Logf("POST %s %s %s: %s", p.payload.ID, p.payload.Type, p.payload.InstanceID, p.payload.Text)
				}
				t.Fatalf("%d POSTs, want %d (each warning and action once)", len(posts), want)
			}
			count := map[string]int{}
			for i, p := range posts {
				pl := p.payload
				if p.sigErr != nil {
					t.Fatalf("POST %d (%s): signature: %v", i, pl.Type, p.sigErr)
				}
				if p.header.Get(alerts.EventHeader) != pl.Type || p.header.Get(alerts.DeliveryHeader) != pl.ID ||
					pl.Account != "acme" || pl.Rule == "" || !strings.Contains(pl.Text, pl.InstanceID) {
					t.Fatalf("POST %d: %+v %v", i, pl, p.header)
				}
				count[pl.Type+" "+pl.InstanceID]++
			}
			wantCount := map[string]int{
				"instance.idle_warning gpi_0123abcd": 2, "instance.stopped gpi_0123abcd": 1,
				"instance.expiring gpi_expiring": 1, "instance.destroyed gpi_expiring": 1,
			}
			for i := range c.replicas {
				wantCount[fmt.Sprintf("instance.destroyed gpi_last%d", i)] = 1
			}
			if fmt.Sprint(count) != fmt.Sprint(wantCount) {
				t.Fatalf("POSTs %v\nwant  %v", count, wantCount)
			}
			for _, d := range ds {
				if d.Status != gpuproxy.AlertDelivered || d.Attempts != 1 || d.LastStatus != http.StatusNoContent ||
					d.Event.InstanceID == "" {
					t.Fatalf("delivery %+v", d)
				}
			}
		})
	}
}
