package attack

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The service checks must be able to fail: each case below breaks one
// promise of a clean run and the checks must name it; the clean run (and
// what chaos excuses) must pass. These run without GPUPROXY_ATTACK (no
// processes, no database).

const (
	catchSvc    = "svc_catch"
	catchSvcKey = "key_svc"
	catchSvcAcc = int64(9)
)

// cleanServiceRun is a service that scaled to two and had its third rent
// refused by its key's window, twice, with a failed attempt (an offer
// gone) on its way to the second replica, under chat load over three
// gpuproxy replicas, one of which was SIGKILLed (a request on it failed
// then) while the database later restarted (one failed then too).
func cleanServiceRun() serviceRun {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	us := func(d time.Duration) int64 { return at(d).UnixMicro() }
	key := func(n, k int, attempt string) string {
		return svcKeyPrefix(catchSvc) + strings.Join([]string{strconv.Itoa(n), strconv.Itoa(k)}, ":") + "#r1." + attempt
	}
	inst := func(id, status, idem string, created time.Duration) *instanceRow {
		return &instanceRow{id: id, account: catchSvcAcc, provider: "vast.ai", providerID: "9" + id[4:], status: status,
			billing: "hourly", price: 620_000, idemKey: idem, keyID: catchSvcKey, createdUS: us(created)}
	}
	s := &dbState{
		nowUS:    us(time.Minute),
		accounts: map[int64]*accountRow{catchSvcAcc: {id: catchSvcAcc, name: svcAccount, limits: []windowLimit{{60, 200_000_000}}}},
		keys: map[string]*keyRow{catchSvcKey: {id: catchSvcKey, name: "attack service", account: catchSvcAcc,
			limits: []windowLimit{{60, 1_710_000}}}},
		instances: map[string]*instanceRow{
			"gpi_r1": inst("gpi_r1", "running", key(1, 0, "1"), 0),
			"gpi_gone": func() *instanceRow {
				in := inst("gpi_gone", "failed", key(2, 0, "1"), 2*time.Second)
				in.providerID = ""
				return in
			}(),
			"gpi_r2": inst("gpi_r2", "running", key(2, 0, "2"), 2*time.Second),
		},
	}
	blocked := func(d time.Duration) svcEventRow {
		return svcEventRow{kind: "service.scale_blocked", atUS: us(d),
			message: "renting replica 3 of 3 was refused (spending_limit_exceeded): spending limit exceeded: API key " + catchSvcKey +
				"'s own 60-minute window allows $1.71; spent $0.000100, held $0, committed $1.370000, so this request's $0.45 does not fit (remaining $0.34)."}
	}
	rows := &svcRows{account: catchSvcAcc, desired: 2,
		replicas: []svcReplicaRow{{instanceID: "gpi_r1", state: "ready", createdUS: us(0)},
			{instanceID: "gpi_r2", state: "ready", createdUS: us(2 * time.Second)}},
		events: []svcEventRow{{kind: "service.replica_rented", instanceID: "gpi_r1", atUS: us(0)},
			{kind: "service.replica_ready", instanceID: "gpi_r1", atUS: us(time.Second)},
			{kind: "service.scaled_up", atUS: us(2 * time.Second)},
			{kind: "service.replica_rented", instanceID: "gpi_r2", atUS: us(2 * time.Second)},
			{kind: "service.replica_ready", instanceID: "gpi_r2", atUS: us(3 * time.Second)},
			{kind: "service.scaled_up", atUS: us(4 * time.Second)}, blocked(4 * time.Second), blocked(5500 * time.Millisecond)},
	}
	sample := func(d time.Duration, live, ready int, sim ...string) svcSample {
		return svcSample{at: at(d), live: live, ready: ready, desired: live, simLive: len(sim), simIDs: sim, maxLive: live}
	}
	samples := []svcSample{sample(0, 1, 0), sample(time.Second, 1, 1, "gpi_r1"), sample(2500*time.Millisecond, 2, 1, "gpi_r1", "gpi_r2"),
		sample(3500*time.Millisecond, 2, 2, "gpi_r1", "gpi_r2"), sample(6*time.Second, 2, 2, "gpi_r1", "gpi_r2")}
	var reqs []chatReq
	for i := range 12 {
		sent := at(time.Duration(i) * time.Second)
		reqs = append(reqs, chatReq{replica: i % 3, sent: sent,
			done: sent.Add(250 * time.Millisecond), status: 200, ok: true, why: "200"})
	}
	reqs = append(reqs,
		chatReq{replica: 2, sent: at(20 * time.Second), done: at(20*time.Second + 100*time.Millisecond), why: "transport"},
		chatReq{replica: 0, sent: at(31 * time.Second), done: at(31*time.Second + 10*time.Millisecond), status: 503,
			why: "503 unavailable"})
	return serviceRun{id: catchSvc, keyID: catchSvcKey, limit: 1_710_000, s: s, rows: rows,
		pis: []providerInstance{{provider: "vast.ai", id: "9r1", tag: "gpi_r1", status: "running"},
			{provider: "vast.ai", id: "9r2", tag: "gpi_r2", status: "running"}},
		samples: samples, reqs: reqs, replicas: 3,
		chaos: []chaosMark{{what: "kill", from: at(20*time.Second + 50*time.Millisecond), to: at(22 * time.Second)},
			{what: "pg", from: at(30 * time.Second), to: at(31 * time.Second)}},
	}
}

func TestServiceChecksCatchBrokenPromises(t *testing.T) {
	t.Parallel()
	// orphan adds an instance rented for the service that no replica
	// row names, created at d, with that status, live at vast.ai or not.
	orphan := func(sr *serviceRun, d time.Duration, status string, live bool) {
		in := *sr.s.instances["gpi_r2"]
		in.id, in.status, in.idemKey = "gpi_o", status, svcKeyPrefix(catchSvc)+"3:1#r1.1"
		in.createdUS = sr.samples[0].at.Add(d).UnixMicro()
		sr.s.instances["gpi_o"] = &in
		if live {
			sr.pis = append(sr.pis, providerInstance{provider: "vast.ai", id: "9o", tag: "gpi_o", status: "running"})
		}
	}
	cases := []struct {
		name   string
		break_ func(sr *serviceRun)
		want   string // "" for a run that must pass
	}{
		{"clean", func(*serviceRun) {}, ""},
		{"an instance rented and destroyed, never a replica, is no leak", func(sr *serviceRun) {
			orphan(sr, 10*time.Second, "terminated", false)
		}, ""},
		{"an instance left running by a leader killed between the rent and its record is excused", func(sr *serviceRun) {
			// In place of a replica lost: the window fits no third.
			sr.rows.replicas[1].state, sr.rows.replicas[1].reason = "gone", "instance_failed"
			sr.s.instances["gpi_r2"].status = "terminated"
			sr.pis = sr.pis[:1]
			orphan(sr, 19*time.Second, "running", true)
		}, ""},
		{"a third replica live at a sample", func(sr *serviceRun) {
			sr.samples[3].live = 3
		}, "3 replicas live"},
		{"a third instance live at vast.ai at a sample", func(sr *serviceRun) {
			s := &sr.samples[4]
			s.simLive, s.simIDs = 3, append(s.simIDs, "gpi_x")
		}, "3 of its instances live at vast.ai"},
		{"three replicas desired", func(sr *serviceRun) { sr.samples[4].desired = 3 }, "3 desired"},
		{"three replicas desired at the end", func(sr *serviceRun) { sr.rows.desired = 3 }, "3 replicas desired at the end"},
		{"never scaled to two", func(sr *serviceRun) {
			for i := range sr.samples {
				sr.samples[i].ready = min(sr.samples[i].ready, 1)
			}
		}, "never scaled to 2"},
		{"no sample read", func(sr *serviceRun) { sr.samples, sr.sampleErrs = nil, 40 }, "the watcher read nothing"},
		{"the third rent never refused by the window", func(sr *serviceRun) {
			for i, e := range sr.rows.events {
				if e.kind == "service.scale_blocked" {
					sr.rows.events[i].message = "renting replica 3 of 3 was refused (no_matching_offer): no offer matches"
				}
			}
		}, "no service.scale_blocked event names"},
		{"a refusal naming another key's window", func(sr *serviceRun) { sr.keyID = "key_other" }, "no service.scale_blocked event names"},
		{"one rent done twice", func(sr *serviceRun) {
			in := *sr.s.instances["gpi_r2"]
			in.id, in.idemKey = "gpi_r2b", svcKeyPrefix(catchSvc)+"2:1#r2.1"
			sr.s.instances[in.id] = &in
			sr.rows.replicas = append(sr.rows.replicas, svcReplicaRow{instanceID: in.id, state: "gone", reason: "scale_down"})
			in.status = "terminated"
		}, "rent 2 was done 2 times"},
		{"an instance left running, no SIGKILL near", func(sr *serviceRun) {
			orphan(sr, 10*time.Second, "running", true)
		}, "leaked GPU: instance gpi_o"},
		{"a replica gone, its instance still running", func(sr *serviceRun) {
			sr.rows.replicas[1].state, sr.rows.replicas[1].reason = "gone", "instance_failed"
		}, "leaked GPU: replica gpi_r2"},
		{"a live replica whose instance is gone", func(sr *serviceRun) {
			sr.s.instances["gpi_r1"].status = "terminated"
			sr.pis = sr.pis[1:]
		}, "but its instance is terminated"},
		{"three replicas live at the end", func(sr *serviceRun) {
			sr.rows.replicas = append(sr.rows.replicas, svcReplicaRow{instanceID: "gpi_r3", state: "starting"})
		}, "3 replicas live at the end"},
		{"three instances live at vast.ai at the end", func(sr *serviceRun) {
			orphan(sr, 21*time.Second, "running", true)
		}, "3 of its instances live at vast.ai at the end"},
		{"an instance of the account the service did not rent", func(sr *serviceRun) {
			sr.s.instances["gpi_r1"].idemKey = "someone-else"
		}, "not a rent of service"},
		{"a chat request failed outside any chaos", func(sr *serviceRun) {
			r := &sr.reqs[3]
			r.ok, r.status, r.why = false, 502, "502 upstream"
		}, "failed outside any chaos"},
		{"a chat request failed on a replica the SIGKILL spared", func(sr *serviceRun) {
			sr.reqs[len(sr.reqs)-2].replica = 0
		}, "failed outside any chaos"},
		{"most chat requests failed", func(sr *serviceRun) {
			for i := range 8 {
				r := &sr.reqs[i]
				r.ok, r.status, r.why = false, 503, "503 unavailable"
				r.sent, r.done = sr.chaos[1].from, sr.chaos[1].to
			}
		}, "answered in full"},
		{"a replica answered nothing", func(sr *serviceRun) {
			var keep []chatReq
			for _, r := range sr.reqs {
				if r.replica != 1 {
					keep = append(keep, r)
				}
			}
			sr.reqs = keep
		}, "replica1 answered no chat request"},
		{"no chat load", func(sr *serviceRun) { sr.reqs = nil }, "no chat request was sent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sr := cleanServiceRun()
			c.break_(&sr)
			var v violations
			sr.check(&v)
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
