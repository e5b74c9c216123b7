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

// searchIDs runs the official client's default search and returns the ask
// ids listed.
func searchIDs(t *testing.T, base string) []int64 {
	t.Helper()
	var ids []int64
	for _, o := range offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(`"limit": 1000`))) {
		ids = append(ids, int64(o["id"].(float64)))
	}
	return ids
}

// takenIDs lists the offers someone else has rented (marked Rented in the
// snapshot while no instance of ours holds them).
func takenIDs(s *Server) []int64 {
	var out []int64
	for _, o := range s.Offers() {
		if o.Rented {
			out = append(out, o.ID)
		}
	}
	return out
}

// TestOfferChurn: a share of the offers a search lists is taken right
// after it; a create on one gets vast.ai's 410 no_such_ask; it is gone from
// later searches until ChurnHold, when its machine comes back under a new
// ask id and the old id is unknown (404).
func TestOfferChurn(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{OfferChurn: 0.3, Seed: 7, ChurnHold: time.Minute, Now: clock.Now, StartDelay: -1})
	listed := searchIDs(t, base)
	taken := takenIDs(s)
	if len(taken) == 0 || len(taken) >= len(listed)/2 {
		t.Fatalf("churn 0.3 took %d of %d listed offers", len(taken), len(listed))
	}
	for _, id := range taken {
		if !slices.Contains(listed, id) {
			t.Fatalf("offer %d was taken without being listed", id)
		}
	}
	gone := taken[0]
	var machine int64
	for _, o := range s.Offers() {
		if o.ID == gone {
			machine = o.MachineID
		}
	}
	r := call(t, "PUT", base+"/api/v0/asks/"+itoa(gone)+"/", testKey, map[string]any{"client_id": "me", "image": "img"})
	want := fmt.Sprintf(`{"ask_id":%d,"error":"no_such_ask","msg":"error 410/3907: no_such_ask Instance type %d is no longer available.","success":false}`, gone, gone)
	if r.Status != http.StatusGone || strings.TrimSpace(string(r.Body)) != want {
		t.Fatalf("create on a taken offer: HTTP %d %s, want 410 %s", r.Status, r.Body, want)
	}
	if n := len(s.Instances()); n != 0 {
		t.Fatalf("a refused create left %d instances", n)
	}
	if slices.Contains(searchIDs(t, base), gone) {
		t.Fatal("a taken offer is listed again before ChurnHold")
	}
	// An offer not taken rents as usual.
	var free int64
	for _, id := range listed {
		if !slices.Contains(takenIDs(s), id) {
			free = id
			break
		}
	}
	if r := call(t, "PUT", base+"/api/v0/asks/"+itoa(free)+"/", testKey, map[string]any{"image": "img"}); r.Status != http.StatusOK {
		t.Fatalf("create on a listed offer: HTTP %d %s", r.Status, r.Body)
	}

	clock.Add(time.Minute)
	back := false
	for _, o := range offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(`"limit": 1000`))) {
		back = back || (int64(o["machine_id"].(float64)) == machine && int64(o["id"].(float64)) != gone)
	}
	if !back {
		t.Fatalf("machine %d not back on the market after ChurnHold", machine)
	}
	if r := call(t, "PUT", base+"/api/v0/asks/"+itoa(gone)+"/", testKey, map[string]any{"image": "img"}); r.Status != http.StatusNotFound ||
		r.JSON(t)["error"] != "invalid_args" {
		t.Fatalf("create on the old ask id: HTTP %d %s, want 404", r.Status, r.Body)
	}
}

// TestOfferChurnIsDeterministic: the same seed and the same searches take
// the same offers; another seed takes others.
func TestOfferChurnIsDeterministic(t *testing.T) {
	t.Parallel()
	run := func(seed int64) [][]int64 {
		s, base := newTestServer(t, Options{OfferChurn: 0.25, Seed: seed, ChurnHold: time.Hour})
		var out [][]int64
		for range 3 {
			searchIDs(t, base)
			out = append(out, takenIDs(s))
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("seed 42 took %v, then %v", a, b)
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Fatalf("seeds 42 and 43 took the same offers %v", a)
	}
}

// TestOfferChurnKeepsHalfTheMarket: even churn 1 leaves at least half the
// catalog listed, search after search.
func TestOfferChurnKeepsHalfTheMarket(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{OfferChurn: 1, ChurnHold: time.Hour})
	half := (len(DefaultCatalog()) + 1) / 2
	for i := range 5 {
		searchIDs(t, base)
		if n := len(s.Offers()) - len(takenIDs(s)); n < half {
			t.Fatalf("search %d: %d offers left listed, want at least %d", i+1, n, half)
		}
	}
	if len(takenIDs(s)) == 0 {
		t.Fatal("churn 1 took nothing")
	}
}

// TestOfferChurnAfterCreates: with ChurnAfter 1 the first search and create
// on a fresh simulator are never disturbed, even at churn 1; after it, the
// next create on a listed offer meets churn.
func TestOfferChurnAfterCreates(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{OfferChurn: 1, ChurnAfter: 1, StartDelay: -1})
	listed := searchIDs(t, base)
	if len(takenIDs(s)) != 0 {
		t.Fatal("churn before the first create")
	}
	if r := call(t, "PUT", base+"/api/v0/asks/"+itoa(listed[0])+"/", testKey, map[string]any{"image": "img"}); r.Status != http.StatusOK {
		t.Fatalf("first create: HTTP %d %s", r.Status, r.Body)
	}
	listed = searchIDs(t, base)
	if r := call(t, "PUT", base+"/api/v0/asks/"+itoa(listed[0])+"/", testKey, map[string]any{"image": "img"}); r.Status != http.StatusGone {
		t.Fatalf("create after churn started: HTTP %d %s, want 410", r.Status, r.Body)
	}
}

// TestCancelUnavailFalseLeavesAStoppedInstance: the official client sends
// cancel_unavail false unless told otherwise; on a machine someone else
// holds, vast.ai then creates the instance stopped (billing storage) rather
// than failing.
func TestCancelUnavailFalseLeavesAStoppedInstance(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{OfferChurn: 1, StartDelay: -1, Now: clock.Now})
	taken := searchIDs(t, base)[0]
	r := call(t, "PUT", base+"/api/v0/asks/"+itoa(taken)+"/", testKey, cliCreate(""))
	m := r.JSON(t)
	if r.Status != http.StatusOK || m["success"] != true || m["new_contract"] == nil {
		t.Fatalf("cancel_unavail false on a taken offer: HTTP %d %s", r.Status, r.Body)
	}
	id := int64(m["new_contract"].(float64))
	clock.Add(time.Hour)
	in, _ := s.Instance(id)
	if in.Status != "stopped" || !near(in.Charged, s.Offers()[0].StorageCost*in.DiskGB/720) {
		t.Fatalf("instance %+v: want stopped, charged storage only", in)
	}
}

// TestOfferChurnGoesOnAtHalfTheMarket: with half the market taken, a search
// still churns — the rental that ends first ends early and its machine is
// relisted — so a long demo keeps meeting taken offers.
func TestOfferChurnGoesOnAtHalfTheMarket(t *testing.T) {
	t.Parallel()
	s, base := newTestServer(t, Options{OfferChurn: 0.5, ChurnHold: time.Hour})
	half := (len(DefaultCatalog()) + 1) / 2
	seen := map[int64]bool{}
	for i := range 8 {
		searchIDs(t, base)
		if n := len(s.Offers()) - len(takenIDs(s)); n < half {
			t.Fatalf("search %d: %d offers left listed, want at least %d", i+1, n, half)
		}
		for _, id := range takenIDs(s) {
			seen[id] = true
		}
	}
	if len(seen) <= len(DefaultCatalog())/2 {
		t.Fatalf("8 searches took %d distinct offers: churn stopped at half the market", len(seen))
	}
}
