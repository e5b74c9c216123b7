package vastaisim

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// rentBid creates a bid instance on offer o at price (0: on demand) and
// returns its id.
func rentBid(t *testing.T, base string, o Offer, price float64) int64 {
	t.Helper()
	body := cliCreate("")
	if price > 0 {
		body = strings.Replace(body, `"price": null`, fmt.Sprintf(`"price": %v`, price), 1)
	}
	r := call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey, body)
	id, ok := r.JSON(t)["new_contract"].(float64)
	if !ok {
		t.Fatalf("create on %d: HTTP %d %s", o.ID, r.Status, r.Body)
	}
	return int64(id)
}

// timeline steps the clock tick by tick for n ticks and records, per tick,
// whether each instance runs.
func timeline(s *Server, clock *teststack.Clock, tick time.Duration, n int, ids ...int64) string {
	var b strings.Builder
	for range n {
		clock.Add(tick)
		for _, id := range ids {
			in, _ := s.Instance(id)
			switch {
			case in.Paused:
				b.WriteByte('p')
			case in.Status == "running":
				b.WriteByte('r')
			default:
				b.WriteByte('.')
			}
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// TestPreemptionIsSeededAndResumes: with a hazard, a bid instance is
// paused (stopped, GPU billing over, storage on) and resumes by itself
// when the outranking rental ends; an on-demand instance never is; equal
// seeds give equal histories, other seeds other ones.
func TestPreemptionIsSeededAndResumes(t *testing.T) {
	t.Parallel()
	run := func(seed int64) (string, *Server, *teststack.Clock, []int64) {
		clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
		s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Seed: seed,
			Market: &Market{Hazard: 6, Hold: 5 * time.Minute, Walk: 0.05}})
		offers := s.Offers()
		// A bid 30% over the list min_bid: the walk (±20%) never outbids it.
		bid := rentBid(t, base, offers[5], round6(offers[5].MinBid*1.3))
		od := rentBid(t, base, offers[6], 0)
		return timeline(s, clock, time.Minute, 120, bid, od), s, clock, []int64{bid, od}
	}
	a, s, clock, ids := run(42)
	if b, _, _, _ := run(42); a != b {
		t.Fatalf("same seed, different histories:\n%s\n%s", a, b)
	}
	if c, _, _, _ := run(43); a == c {
		t.Fatal("seeds 42 and 43 gave the same history")
	}
	if !strings.Contains(a, "pr") || !strings.Contains(a, "rr") {
		t.Fatalf("the bid instance should be paused and resume within 2 h at 6/h: %s", a)
	}
	for i := 1; i < len(a); i += 3 {
		if a[i] != 'r' {
			t.Fatalf("the on-demand instance was not running at tick %d: %s", i/3, a)
		}
	}
	// While paused: actual_status stopped, intended running, GPU billing
	// stopped, storage going on.
	bid := ids[0]
	for in, _ := s.Instance(bid); !in.Paused; in, _ = s.Instance(bid) {
		clock.Add(time.Minute)
	}
	before, _ := s.Instance(bid)
	clock.Add(time.Second)
	after, _ := s.Instance(bid)
	st := s.Offers()[5].StorageCost * 20 / 720
	if after.Status != "stopped" || !strings.HasPrefix(after.StatusMsg, "paused: ") || after.Preemptions == 0 {
		t.Fatalf("paused instance: %+v", after)
	}
	if d := after.Charged - before.Charged; d < 0 || d > 2*st/3600 {
		t.Fatalf("paused for a second: charged %v, want storage only (%v/s)", d, st/3600)
	}
}

// TestPriorityRules: on-demand outranks any bid; a higher bid outranks a
// lower one, and raising the bid (change bid) wins the machine back at
// once; a bid under min_bid waits, paused, and starts when min_bid falls
// below it; a stopped instance whose GPUs were taken waits to start.
func TestPriorityRules(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	// OnDemandShare < 0: every outranking rental is a higher bid.
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Seed: 1,
		Market: &Market{Hazard: 60, OnDemandShare: -1, Hold: time.Hour, Trace: []TraceEvent{
			{At: 30 * time.Minute, Kind: TraceBid, GPU: "RTX 4090", Value: 0.5}}}})
	offers := s.Offers()
	hi := rentBid(t, base, offers[6], round6(offers[6].MinBid))
	for in, _ := s.Instance(hi); !in.Paused; in, _ = s.Instance(hi) {
		clock.Add(time.Minute)
	}
	in, _ := s.Instance(hi)
	if !strings.Contains(in.StatusMsg, "outbid: a bid of") {
		t.Fatalf("outbid message %q", in.StatusMsg)
	}
	r := call(t, "PUT", base+"/api/v0/instances/bid_price/"+itoa(hi)+"/", testKey, `{"client_id": "me", "price": null}`)
	if in, _ = s.Instance(hi); r.Status != http.StatusOK || in.Paused || in.Status != "running" {
		t.Fatalf("raising to the winning bid: HTTP %d, %+v", r.Status, in)
	}
	// On demand outranks: no bid wins it back.
	if err := s.Preempt(hi, time.Hour); err != nil {
		t.Fatal(err)
	}
	call(t, "PUT", base+"/api/v0/instances/bid_price/"+itoa(hi)+"/", testKey, `{"client_id": "me", "price": 100}`)
	if in, _ = s.Instance(hi); !in.Paused || !strings.Contains(in.StatusMsg, "on-demand") {
		t.Fatalf("a bid of $100 beat an on-demand rental: %+v", in)
	}

	// Under min_bid: created (with vast.ai's error reply), paused until the
	// trace halves the 4090s' min_bid at 30 minutes.
	low := offers[5]
	r = call(t, "PUT", base+"/api/v0/asks/"+itoa(low.ID)+"/", testKey,
		strings.Replace(cliCreate(""), `"price": null`, fmt.Sprintf(`"price": %v`, round6(low.MinBid*0.7)), 1))
	lowID := int64(r.JSON(t)["new_contract"].(float64))
	if in, _ = s.Instance(lowID); r.Status != http.StatusBadRequest || !in.Paused {
		t.Fatalf("low bid: HTTP %d, %+v", r.Status, in)
	}
	clock.Add(time.Unix(1_800_000_000, 0).Add(31 * time.Minute).Sub(clock.Now()))
	if in, _ = s.Instance(lowID); in.Paused && !strings.Contains(in.StatusMsg, "outbid: a bid") {
		t.Fatalf("min_bid halved, the low bid still waits: %+v", in)
	}

	// An on-demand instance stopped by its owner gives its GPUs up; at
	// this hazard someone takes them, and a start waits ("scheduling").
	od := rentBid(t, base, offers[0], 0)
	call(t, "PUT", base+"/api/v0/instances/"+itoa(od)+"/", testKey, `{"state": "stopped"}`)
	clock.Add(10 * time.Minute)
	call(t, "PUT", base+"/api/v0/instances/"+itoa(od)+"/", testKey, `{"state": "running"}`)
	if in, _ = s.Instance(od); in.Status != "stopped" || !strings.HasPrefix(in.StatusMsg, "scheduling: ") {
		t.Fatalf("start after someone took the GPUs: %+v", in)
	}
}

// TestPriceWalkIsBounded: prices move every tick, never beyond list ×
// (1 ± WalkBound), alike for equal seeds; instances keep their price.
func TestPriceWalkIsBounded(t *testing.T) {
	t.Parallel()
	prices := func(seed int64) ([]Offer, []Offer, float64) {
		clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
		s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Seed: seed,
			Market: &Market{Walk: 0.05, WalkBound: 0.2}})
		list := s.Offers()
		id := rentBid(t, base, list[0], 0)
		in0, _ := s.Instance(id)
		clock.Add(2000 * time.Minute)
		in1, _ := s.Instance(id)
		return list, s.Offers(), in1.DPHTotal - in0.DPHTotal
	}
	list, walked, drift := prices(9)
	if drift != 0 {
		t.Fatalf("a rented instance's price moved by %v", drift)
	}
	moved := 0
	for i, o := range walked {
		l := list[i]
		if o.ID != l.ID {
			t.Fatalf("offer %d became %d without hosts coming or going", l.ID, o.ID)
		}
		for _, p := range [][2]float64{{o.DPHBase, l.DPHBase}, {o.MinBid, l.MinBid}} {
			if p[0] < p[1]*0.8-1e-6 || p[0] > p[1]*1.2+1e-6 {
				t.Fatalf("offer %d: price %v walked beyond ±20%% of %v", o.ID, p[0], p[1])
			}
		}
		if o.DPHBase != l.DPHBase {
			moved++
		}
	}
	if moved < len(walked)/2 {
		t.Fatalf("only %d of %d prices moved in 2000 ticks", moved, len(walked))
	}
	if _, again, _ := prices(9); !slices.Equal(walked, again) {
		t.Fatal("seed 9 walked differently twice")
	}
	if _, other, _ := prices(10); slices.Equal(walked, other) {
		t.Fatal("seeds 9 and 10 walked alike")
	}
}

// TestSupplyReturns: the floor keeps single-GPU offers of every model
// listed however many are rented; destroyed instances' machines come
// back; hosts come and go at HostRate within bounds.
func TestSupplyReturns(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Seed: 3,
		Market: &Market{MinSingles: 2, HostRate: 30}})
	single4090 := cliSearch(`"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": "1"}`)
	var rented []int64
	for range 6 { // three times what the floor keeps
		rows := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, single4090))
		if len(rows) < 2 {
			t.Fatalf("after %d rents, %d single 4090s listed; want ≥ 2", len(rented), len(rows))
		}
		rented = append(rented, rentBid(t, base, Offer{ID: int64(rows[0]["id"].(float64))}, 0))
	}
	for _, name := range s.gpuNames {
		if n := len(offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey,
			cliSearch(fmt.Sprintf(`"gpu_name": {"eq": %q}, "num_gpus": {"eq": "1"}`, name))))); n < 2 {
			t.Fatalf("%s: %d single-GPU offers listed, want ≥ 2", name, n)
		}
	}
	// A destroyed instance's machine is listed again (under a new ask id).
	in, _ := s.Instance(rented[0])
	call(t, "DELETE", base+"/api/v0/instances/"+itoa(rented[0])+"/", testKey, `{}`)
	back := false
	for _, o := range s.Offers() {
		back = back || (!o.Rented && o.MachineID == s.instances[in.ID].offer.MachineID)
	}
	if !back {
		t.Fatal("the destroyed instance's machine did not come back")
	}
	// Hosts leave and arrive: a day at 30 an hour changes the market, and
	// it stays between half and one and a half catalogs.
	before := map[int64]bool{}
	for _, o := range s.Offers() {
		before[o.MachineID] = true
	}
	clock.Add(24 * time.Hour)
	gone, arrived, listed := 0, 0, 0
	now := map[int64]bool{}
	for _, o := range s.Offers() {
		now[o.MachineID] = true
		if !before[o.MachineID] {
			arrived++
		}
		if !o.Rented {
			listed++
		}
	}
	for m := range before {
		if !now[m] {
			gone++
		}
	}
	n := len(DefaultCatalog())
	if gone == 0 || arrived == 0 || listed < n/2 || listed > n*3/2+2*len(s.gpuNames) {
		t.Fatalf("a day of hosts: %d left, %d arrived, %d listed (catalog %d)", gone, arrived, listed, n)
	}
}

// TestTrace: a trace file parses (comments, durations or seconds), bad
// lines name their line, and a preempt wave pauses every bid instance of
// its model at its time, for its length.
func TestTrace(t *testing.T) {
	t.Parallel()
	ev, err := ParseTrace(strings.NewReader(`# a wave at two minutes
{"at":"2m","kind":"preempt","gpu":"RTX 4090","value":300}

{"at":600,"kind":"hazard","value":0.5}
{"at":"1h","kind":"price","gpu":"H100 SXM","value":1.3}`))
	if err != nil || len(ev) != 3 || ev[1].At != 10*time.Minute || ev[0].Value != 300 {
		t.Fatalf("ParseTrace: %v %+v", err, ev)
	}
	for _, bad := range []string{`{"at":"2m","kind":"nap"}`, `{"at":"soon","kind":"hazard"}`,
		`{"at":"1m","kind":"price","value":0}`, `{"at":"1m","kind":"hazard","value":1,"extra":1}`} {
		if _, err := ParseTrace(strings.NewReader("\n" + bad)); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Fatalf("%s: %v, want an error on line 2", bad, err)
		}
	}
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Market: &Market{Trace: ev}})
	offers := s.Offers()
	bid := rentBid(t, base, offers[5], round6(offers[5].MinBid*1.3))
	other := rentBid(t, base, offers[11], round6(offers[11].MinBid*1.3)) // an RTX 5090
	if got := timeline(s, clock, time.Minute, 9, bid, other); got != "rr pr pr pr pr pr rr rr rr " {
		t.Fatalf("wave from 2 to 7 minutes on the 4090 only: %q", got)
	}
}
