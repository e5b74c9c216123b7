package vastaisim

import (
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// rentFirst rents the first offer with body and returns the instance id.
func rentFirst(t *testing.T, s *Server, base, body string) int64 {
	t.Helper()
	r := call(t, "PUT", base+"/api/v0/asks/"+itoa(s.Offers()[0].ID)+"/", testKey, body)
	id, ok := r.JSON(t)["new_contract"].(float64)
	if !ok {
		t.Fatalf("create: HTTP %d %s", r.Status, r.Body)
	}
	return int64(id)
}

// billed reads what the simulator says it charged an instance so far, in
// each place it says so: the charges endpoint (amount and its gpu and disk
// items), the snapshot, and the credit of /users/current/ (credit less
// every instance's charges). They must agree.
func billed(t *testing.T, s *Server, base string, id int64, credit float64) (gpu, disk float64) {
	t.Helper()
	f := url.QueryEscape(`{"day":{"gte":1700000000,"lte":1900000000},"type":{"in":["instance"]}}`)
	res := call(t, "GET", base+"/api/v0/charges/?select_filters="+f, testKey, nil).JSON(t)
	var amount, all float64
	found := false
	for _, row := range res["results"].([]any) {
		row := row.(map[string]any)
		all += row["amount"].(float64)
		if row["source"] != "instance-"+itoa(id) {
			continue
		}
		found = true
		amount = row["amount"].(float64)
		for _, it := range row["items"].([]any) {
			it := it.(map[string]any)
			switch it["type"] {
			case "gpu":
				gpu = it["amount"].(float64)
			case "disk":
				disk = it["amount"].(float64)
			}
		}
	}
	if !found {
		t.Fatalf("no charge row for instance %d: %v", id, res)
	}
	in, _ := s.Instance(id)
	u := call(t, "GET", base+"/api/v0/users/current/", testKey, nil).JSON(t)
	if !near(amount, gpu+disk) || !near(in.Charged, amount) || !near(u["credit"].(float64), credit-all) {
		t.Fatalf("charges disagree: amount %v, items %v+%v, snapshot %v, credit %v of %v",
			amount, gpu, disk, in.Charged, u["credit"], credit)
	}
	return gpu, disk
}

func near(a, b float64) bool { return math.Abs(a-b) < 2e-6 }

// TestBillingFollowsVastAI: storage bills from creation to destroy, GPU
// time (dph_base) only while running — not while loading, not while
// stopped — and every place that reports money agrees.
func TestBillingFollowsVastAI(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{StartDelay: 6 * time.Minute, Now: clock.Now, Credit: 50})
	o := s.Offers()[0]
	// 360 GB at $0.15/GB/month (of 720 hours) is $0.075/hour of storage.
	id := rentFirst(t, s, base, strings.Replace(cliCreate(""), `"disk": 20.0`, `"disk": 360`, 1))
	storage := o.StorageCost * 360 / 720
	inst := base + "/api/v0/instances/" + itoa(id) + "/"
	steps := []struct {
		name      string
		do        func()
		gpuHours  float64 // cumulative
		diskHours float64
	}{
		{"loading for 6 minutes: storage only", func() { clock.Add(6 * time.Minute) }, 0, 0.1},
		{"running for an hour", func() { clock.Add(time.Hour) }, 1, 1.1},
		{"stopped for two hours: storage only", func() {
			call(t, "PUT", inst, testKey, map[string]any{"state": "stopped"})
			clock.Add(2 * time.Hour)
		}, 1, 3.1},
		{"started: loading again, storage only", func() {
			call(t, "PUT", inst, testKey, map[string]any{"state": "running"})
			clock.Add(6 * time.Minute)
		}, 1, 3.2},
		{"running half an hour more", func() { clock.Add(30 * time.Minute) }, 1.5, 3.7},
		{"destroyed: nothing more", func() {
			if r := call(t, "DELETE", inst, testKey, map[string]any{}); r.Status != http.StatusOK {
				t.Fatalf("destroy: HTTP %d", r.Status)
			}
			clock.Add(5 * time.Hour)
		}, 1.5, 3.7},
	}
	for _, st := range steps {
		st.do()
		gpu, disk := billed(t, s, base, id, 50)
		if !near(gpu, st.gpuHours*o.DPHBase) || !near(disk, st.diskHours*storage) {
			t.Fatalf("%s: gpu $%v, disk $%v; want %v h × $%v and %v h × $%v", st.name, gpu, disk,
				st.gpuHours, o.DPHBase, st.diskHours, storage)
		}
	}
}

// TestBidsBillAtTheBid: an interruptible instance's GPU time bills at its
// bid, not dph_base; a bid under min_bid leaves a stopped instance that
// bills storage only.
func TestBidsBillAtTheBid(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now})
	offers := s.Offers()
	rent := func(o Offer, price float64) int64 {
		r := call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey,
			map[string]any{"client_id": "me", "image": "img", "disk": 10, "price": price})
		id, ok := r.JSON(t)["new_contract"].(float64)
		if !ok {
			t.Fatalf("bid %v: HTTP %d %s", price, r.Status, r.Body)
		}
		return int64(id)
	}
	high := offers[len(offers)-1]
	bid := high.MinBid + 0.25
	good := rent(high, bid)
	low := rent(offers[0], offers[0].MinBid/2)
	clock.Add(2 * time.Hour)
	storage := func(o Offer) float64 { return o.StorageCost * 10 / 720 }
	if gpu, disk := billed(t, s, base, good, DefaultCredit); !near(gpu, 2*bid) || !near(disk, 2*storage(high)) {
		t.Fatalf("bid instance: gpu %v disk %v, want %v and %v", gpu, disk, 2*bid, 2*storage(high))
	}
	if in, _ := s.Instance(good); !in.IsBid || !near(in.DPHTotal, bid+storage(high)) {
		t.Fatalf("bid instance %+v: dph_total should be the bid plus storage", in)
	}
	in, _ := s.Instance(low)
	if in.Status != "stopped" {
		t.Fatalf("low bid left status %q", in.Status)
	}
	f := url.QueryEscape(`{"day":{"gte":1700000000,"lte":1900000000}}`)
	for _, row := range call(t, "GET", base+"/api/v0/charges/?select_filters="+f, testKey, nil).JSON(t)["results"].([]any) {
		row := row.(map[string]any)
		if row["source"] == "instance-"+itoa(low) && !near(row["amount"].(float64), 2*storage(offers[0])) {
			t.Fatalf("low bid, stopped: charged %v, want storage only %v", row["amount"], 2*storage(offers[0]))
		}
	}
}
