package ionetsim

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// replicas returns available-replicas by location id for hw and qty.
func (e *env) replicas(hw, qty int) map[int]int {
	e.t.Helper()
	st, body := e.call("GET", fmt.Sprintf("%s/available-replicas?hardware_id=%d&hardware_qty=%d", Prefix, hw, qty), nil)
	if st != 200 {
		e.t.Fatalf("available-replicas: %d %v", st, body)
	}
	out := map[int]int{}
	for _, r := range body["data"].([]any) {
		m := r.(map[string]any)
		out[int(m["id"].(float64))] = int(m["available_replicas"].(float64))
	}
	return out
}

// TestOfferChurnTakesListedOffers: with OfferChurn 1 every listed offer is
// taken before our deploy, which gets io.net's no-capacity answer; the
// capacity is gone from later look-ups and comes back after ChurnHold.
func TestOfferChurnTakesListedOffers(t *testing.T) {
	t.Parallel()
	clk := teststack.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, Options{Now: clk.Now, OfferChurn: 1, ChurnHold: time.Minute})

	// The answer io.net gives for capacity that is really gone.
	wantSt, want := e.call("POST", Prefix+"/deploy", deployBody("real", 215, 1, 1, 1))
	if wantSt != 400 || !strings.HasPrefix(want["detail"].(string), "Not enough capacity") {
		t.Fatalf("no-capacity deploy: %d %v", wantSt, want)
	}

	listed := map[int]int{1: 16, 7: 8}
	if got := e.replicas(203, 1); !maps.Equal(got, listed) {
		t.Fatalf("first look-up %v, want %v", got, listed)
	}
	// Taken only once we deploy: until then the listing stands (a quote
	// would still succeed).
	if got := e.replicas(203, 1); !maps.Equal(got, listed) {
		t.Fatalf("second look-up %v, want %v", got, listed)
	}
	st, body := e.call("POST", Prefix+"/deploy", deployBody("mine", 203, 1, 1, 1))
	if st != wantSt || !strings.HasPrefix(body["detail"].(string), "Not enough capacity: 1 container(s) of 1 GPU(s) of hardware 203 requested in location 1, 0 available") {
		t.Fatalf("deploy of a taken offer: %d %v, want %d like %v", st, body, wantSt, want)
	}
	if len(e.sim.Deployments()) != 0 {
		t.Fatal("a deploy of a taken offer created a deployment")
	}
	if got := e.replicas(203, 1); !maps.Equal(got, map[int]int{1: 0, 7: 0}) {
		t.Fatalf("taken capacity still listed: %v", got)
	}
	clk.Add(59 * time.Second)
	if free := freeGPUs(e.sim, 203, 1); free != 0 {
		t.Fatalf("capacity back before ChurnHold: %d free", free)
	}
	clk.Add(time.Second)
	if got := e.replicas(203, 1); !maps.Equal(got, listed) {
		t.Fatalf("after ChurnHold: %v, want %v", got, listed)
	}
	if free := freeGPUs(e.sim, 203, 1); free != 16 {
		t.Fatalf("after ChurnHold: %d free, want 16", free)
	}
}

// TestOfferChurnTakesJustTheOffer: the other customer rents enough that the
// listed container size no longer fits; smaller ones still do. A hardware
// listing (a new search) finds the listing taken, as a deploy does.
func TestOfferChurnTakesJustTheOffer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Options{OfferChurn: 1, ChurnHold: time.Hour})
	if got := e.replicas(203, 8); got[1] != 2 {
		t.Fatalf("look-up: %v", got)
	}
	if st, body := e.call("GET", Prefix+"/hardware/max-gpus-per-container", nil); st != 200 {
		t.Fatal(st, body)
	}
	if free := freeGPUs(e.sim, 203, 1); free != 7 {
		t.Fatalf("after the hardware listing %d GPUs free at the location, want 7", free)
	}
	if got := e.replicas(203, 4); got[1] != 1 {
		t.Fatalf("a smaller container must still fit: %v", got)
	}
	// That listing is taken in turn (OfferChurn 1), again leaving one GPU
	// less than its size.
	if st, body := e.call("POST", Prefix+"/deploy", deployBody("small", 203, 1, 4, 1)); st != 400 {
		t.Fatalf("deploy of the taken 4-GPU offer: %d %v", st, body)
	}
	if free := freeGPUs(e.sim, 203, 1); free != 3 {
		t.Fatalf("after the deploy %d GPUs free at the location, want 3", free)
	}
	e.deploy("one", 203, 1, 1, 1) // never listed, so not taken
}

// TestOfferChurnShareAndSeed: the share of listings taken follows
// OfferChurn; equal seeds take the same offers whatever the order of the
// look-ups; another seed takes others; 0 takes none.
func TestOfferChurnShareAndSeed(t *testing.T) {
	t.Parallel()
	type look struct{ hw, qty int }
	var looks []look
	for _, h := range DefaultCatalog() {
		for _, q := range []int{1, 2, 4, 8} {
			looks = append(looks, look{h.ID, q})
		}
	}
	run := func(o Options, reverse bool) (taken []map[offerKey]bool, listed int) {
		e := newEnv(t, o)
		for range 20 {
			for i := range looks {
				l := looks[i]
				if reverse {
					l = looks[len(looks)-1-i]
				}
				for _, n := range e.replicas(l.hw, l.qty) {
					if n > 0 {
						listed++
					}
				}
			}
			e.sim.mu.Lock()
			taken = append(taken, maps.Clone(e.sim.churn.pending))
			clear(e.sim.churn.pending) // nobody deploys: start the next round afresh
			e.sim.mu.Unlock()
		}
		return taken, listed
	}
	count := func(rounds []map[offerKey]bool) (n int) {
		for _, r := range rounds {
			n += len(r)
		}
		return n
	}
	a, listed := run(Options{OfferChurn: 0.3, Seed: 42}, false)
	b, _ := run(Options{OfferChurn: 0.3, Seed: 42}, true)
	c, _ := run(Options{OfferChurn: 0.3, Seed: 43}, false)
	for i := range a {
		if !maps.Equal(a[i], b[i]) {
			t.Fatalf("round %d: the same seed took %v, then %v in another order", i, a[i], b[i])
		}
	}
	share := float64(count(a)) / float64(listed)
	if share < 0.2 || share > 0.4 {
		t.Fatalf("took %d of %d listings (%.2f), want about 0.3", count(a), listed, share)
	}
	same := true
	for i := range a {
		same = same && maps.Equal(a[i], c[i])
	}
	if same {
		t.Fatal("seeds 42 and 43 took the same offers")
	}
	if none, _ := run(Options{}, false); count(none) != 0 {
		t.Fatalf("OfferChurn 0 took %d offers", count(none))
	}
}
