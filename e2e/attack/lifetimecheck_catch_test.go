package attack

import (
	"strings"
	"testing"
	"time"
)

// The lifetime checks must be able to fail: each case below breaks one
// promise of a clean run and the checks must name it; the clean run (and
// the repeats chaos explains) must pass. These run without
// GPUPROXY_ATTACK (no processes, no database).

// cleanLifetimeRun is two lifetime instances acted on as promised: a
// vast.ai one stopped after 5 s of traffic, and a quiet io.net one asked
// to stop and destroyed (io.net cannot stop; its DELETE re-sent until
// io.net confirmed).
func cleanLifetimeRun() lifetimeRun {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	us := func(d time.Duration) int64 { return at(d).UnixMicro() }
	busy := &idleInst{kind: trafficKinds[0], id: "gpi_busy", sent: 20, served: 20, runningAt: at(0),
		firstServed: at(100 * time.Millisecond), lastServed: at(5 * time.Second)}
	quiet := &idleInst{kind: quietKinds[3], id: "gpi_quiet", runningAt: at(0)}
	acted := 15*time.Second + 10*time.Millisecond
	s := &dbState{instances: map[string]*instanceRow{
		"gpi_busy": {id: "gpi_busy", provider: "vast.ai", providerID: "101", status: "stopped", billing: "hourly",
			startedUS: us(0), idleTimeoutMS: 10_000, idleAction: "stop", actedRule: "idle_timeout", actedUS: us(acted),
			lastActivityUS: us(5 * time.Second)},
		"gpi_quiet": {id: "gpi_quiet", provider: "io.net", providerID: "dep-1", status: "terminated", billing: "prepaid",
			startedUS: us(0), idleTimeoutMS: 10_000, idleAction: "destroy", actedRule: "idle_timeout",
			actedUS: us(10*time.Second + 5*time.Millisecond)},
	}, meters: []meterRow{{id: "m1", instanceID: "gpi_busy", startUS: us(0), stopUS: us(acted + 40*time.Millisecond),
		chargedUntilUS: us(acted + 40*time.Millisecond), stopped: true}},
		ledger: []ledgerRow{{typ: "charge", instanceID: "gpi_busy", key: "meter:m1:0", atUS: us(acted + 40*time.Millisecond)},
			{typ: "charge", instanceID: "gpi_quiet", basis: "prepaid", atUS: us(-time.Second)},
			{typ: "refund", instanceID: "gpi_quiet", atUS: us(11 * time.Second)}}}
	return lifetimeRun{
		insts: []*idleInst{busy, quiet, {kind: quietKinds[0], final: reply{status: 409}}},
		s:     s,
		pis: []providerInstance{{provider: "vast.ai", id: "101", tag: "gpi_busy", status: "stopped"},
			{provider: "io.net", id: "dep-1", tag: "gpi_quiet", status: "termination requested"}},
		calls: []simCall{{provider: "vast.ai", providerID: "101", action: "stop", at: at(acted + 20*time.Millisecond), status: 200},
			{provider: "io.net", providerID: "dep-1", action: "destroy", at: at(10*time.Second + 9*time.Millisecond), status: 200},
			{provider: "io.net", providerID: "dep-1", action: "destroy", at: at(10*time.Second + 200*time.Millisecond), status: 200}},
		seen:    map[string]*actHistory{"gpi_busy": {status: "stopped", acts: []actSeen{{rule: "idle_timeout", us: us(acted)}}}},
		chaos:   []chaosMark{{what: "kill", from: at(2 * time.Second), to: at(3 * time.Second)}},
		logActs: map[string]int{"gpi_busy": 1, "gpi_quiet": 1},
		metric:  2,
	}
}

func TestLifetimeChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	second := func(lr *lifetimeRun, at time.Duration) {
		c := lr.calls[0]
		c.at = c.at.Add(at)
		lr.calls = append(lr.calls, c)
	}
	cases := []struct {
		name   string
		break_ func(lr *lifetimeRun)
		want   string // "" for a run that must pass
	}{
		{"clean", func(*lifetimeRun) {}, ""},
		{"a second stop after the database restarted in between is explained", func(lr *lifetimeRun) {
			second(lr, 2*time.Second)
			lr.chaos = append(lr.chaos, chaosMark{what: "pg", from: lr.calls[0].at.Add(time.Second), to: lr.calls[0].at.Add(1500 * time.Millisecond)})
			lr.logActs["gpi_busy"] = 2
		}, ""},
		{"acted on while traffic flowed", func(lr *lifetimeRun) {
			lr.insts[0].lastServed = lr.insts[0].runningAt.Add(9 * time.Second)
			row := lr.s.instances["gpi_busy"]
			row.actedUS = time.UnixMicro(row.startedUS).Add(10*time.Second + time.Millisecond).UnixMicro()
		}, "while its traffic flowed"},
		{"acted on before running plus the idle timeout", func(lr *lifetimeRun) {
			lr.s.instances["gpi_quiet"].actedUS -= 2_000_000
		}, "before running + idle timeout"},
		{"acted on late", func(lr *lifetimeRun) {
			lr.s.instances["gpi_quiet"].actedUS += int64((idleLate + time.Second) / time.Microsecond)
		}, "after its idle deadline"},
		{"never acted on", func(lr *lifetimeRun) {
			row := lr.s.instances["gpi_busy"]
			row.status, row.actedRule, row.actedUS = "running", "", 0
		}, "not acted on: still running"},
		{"destroyed though asked to stop", func(lr *lifetimeRun) {
			lr.s.instances["gpi_busy"].status = "terminated"
		}, "want stopped"},
		{"another rule acted", func(lr *lifetimeRun) {
			lr.s.instances["gpi_quiet"].actedRule = "max_duration"
		}, "want idle_timeout"},
		{"acted_us set twice", func(lr *lifetimeRun) {
			h := lr.seen["gpi_busy"]
			h.acts = append(h.acts, actSeen{rule: "idle_timeout", us: h.acts[0].us + 1_000_000})
		}, "changed after being set"},
		{"acted_rule cleared", func(lr *lifetimeRun) { lr.seen["gpi_busy"].cleared = true }, "cleared after being set"},
		{"the row lost its rules", func(lr *lifetimeRun) { lr.s.instances["gpi_busy"].idleTimeoutMS = 3_600_000 }, "but its row has"},
		{"stopped twice without cause", func(lr *lifetimeRun) { second(lr, 2*time.Second) }, "acted on more than once"},
		{"a provider call before the decision", func(lr *lifetimeRun) {
			lr.calls[0].at = time.UnixMicro(lr.s.instances["gpi_busy"].actedUS).Add(-time.Millisecond)
		}, "before the decision"},
		{"no provider call", func(lr *lifetimeRun) { lr.calls = lr.calls[1:] }, "never received a stop call"},
		{"destroyed at the provider though asked to stop", func(lr *lifetimeRun) { lr.calls[0].action = "destroy" },
			"received a destroy call"},
		{"still running at the provider", func(lr *lifetimeRun) { lr.pis[0].status = "running" }, "lists it as \"running\""},
		{"still live at io.net", func(lr *lifetimeRun) { lr.pis[1].status = "running" }, "still lists it"},
		{"someone else stopped", func(lr *lifetimeRun) {
			lr.calls = append(lr.calls, simCall{provider: "vast.ai", providerID: "999", action: "stop", at: lr.calls[0].at, status: 200})
		}, "no lifetime instance asked for that"},
		{"the meter still runs", func(lr *lifetimeRun) { lr.s.meters[0].stopped = false }, "its meter still runs"},
		{"metered long past the decision", func(lr *lifetimeRun) {
			lr.s.meters[0].stopUS += int64(stopLag / time.Microsecond)
		}, "after the decision (allowed"},
		{"charged after the stop", func(lr *lifetimeRun) {
			lr.s.ledger = append(lr.s.ledger, ledgerRow{typ: "charge", instanceID: "gpi_busy", key: "meter:m1:1",
				atUS: lr.s.meters[0].stopUS + 1_000_000})
		}, "after it was stopped"},
		{"charged after the destroy", func(lr *lifetimeRun) {
			lr.s.ledger = append(lr.s.ledger, ledgerRow{typ: "charge", instanceID: "gpi_quiet", key: "extra",
				atUS: lr.s.instances["gpi_quiet"].actedUS + int64(stopLag/time.Microsecond) + 1})
		}, "after it was terminated"},
		{"traffic never served", func(lr *lifetimeRun) { lr.insts[0].served = 0 }, "its activity was not tested"},
		{"activity never stored", func(lr *lifetimeRun) { lr.s.instances["gpi_busy"].lastActivityUS = 0 }, "has no last activity"},
		{"acted twice by the log", func(lr *lifetimeRun) { lr.logActs["gpi_quiet"] = 2 }, "log lines, want one"},
		{"the metric missed an act", func(lr *lifetimeRun) { lr.metric = 1 }, "gpuproxy_instances_stopped_total"},
		{"nothing rented", func(lr *lifetimeRun) {
			for _, in := range lr.insts {
				in.id = ""
			}
		}, "no lifetime instance was rented"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lr := cleanLifetimeRun()
			c.break_(&lr)
			var v violations
			lr.check(&v)
			if c.want == "" {
				if len(v.list) > 0 {
					t.Fatalf("a run that keeps its promises was flagged:\n%s", strings.Join(v.list, "\n"))
				}
				return
			}
			for _, s := range v.list {
				if strings.Contains(s, c.want) {
					return
				}
			}
			t.Fatalf("want a violation containing %q, got:\n%s", c.want, strings.Join(v.list, "\n"))
		})
	}
}
