package vastaisim

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/teststack"
)

// The requests in these tests are byte for byte what vast-cli's vast.py
// sends for the commands named (read from its source: search__offers,
// create__instance, change__bid, reboot__instance, logs,
// show__invoices_v1 and apiurl, which JSON-encodes every non-string query
// value with json.dumps and then quote_plus).

// pyQuery renders query parameters as vast.py's apiurl does: values that
// are not strings as Python's json.dumps text (", " and ": " separators),
// then quote_plus, in the order given.
func pyQuery(kv ...string) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		parts = append(parts, kv[i]+"="+url.QueryEscape(kv[i+1]))
	}
	return strings.Join(parts, "&")
}

// cliBidSearch is the body of `vastai search offers --type bid` with the
// filters of the query spliced in (parse_query's rendering).
func cliBidSearch(filters string) string {
	return strings.Replace(cliSearch(filters), `"type": "on-demand"`, `"type": "bid"`, 1)
}

func TestVastPySearchOffersTypeBid(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	ondemand := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(`"gpu_name": {"eq": "RTX 4090"}`)))
	bids := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliBidSearch(`"gpu_name": {"eq": "RTX 4090"}`)))
	if len(bids) == 0 || len(bids) != len(ondemand) {
		t.Fatalf("bid search: %d rows, on-demand %d", len(bids), len(ondemand))
	}
	byID := map[float64]map[string]any{}
	for _, o := range ondemand {
		byID[o["id"].(float64)] = o
	}
	for _, b := range bids {
		o := byID[b["id"].(float64)]
		minBid, dph, storage := b["min_bid"].(float64), b["dph_total"].(float64), b["storage_total_cost"].(float64)
		if b["is_bid"] != true || o["is_bid"] != false {
			t.Fatalf("is_bid: bid row %v, on-demand row %v", b["is_bid"], o["is_bid"])
		}
		if !near(dph, minBid+storage) || !near(b["search"].(map[string]any)["totalHour"].(float64), dph) {
			t.Fatalf("bid row dph_total %v, want min_bid %v + storage %v", dph, minBid, storage)
		}
		// vast.ai: interruptible is "often 50%+ cheaper" ("saves 50-80%").
		if share := minBid / o["dph_base"].(float64); share < 0.2 || share > 0.5+1e-9 {
			t.Fatalf("min_bid %v is %.0f%% of on-demand %v, want 20–50%%", minBid, 100*share, o["dph_base"])
		}
	}
	// Filters and order see the bid prices: dph<0.2 finds 4090 bids, no
	// on-demand 4090.
	cheap := `"gpu_name": {"eq": "RTX 4090"}, "dph_total": {"lt": "0.2"}`
	if n, m := len(offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliBidSearch(cheap)))),
		len(offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey, cliSearch(cheap)))); n == 0 || m != 0 {
		t.Fatalf("dph<0.2: %d bid rows, %d on-demand rows; want some and none", n, m)
	}
	// --type interruptible is sent as "bid"; the server also takes the old word.
	if rows := offersOf(t, call(t, "POST", base+"/api/v0/bundles/", testKey,
		strings.Replace(cliSearch(""), `"on-demand"`, `"interruptible"`, 1))); rows[0]["is_bid"] != true {
		t.Fatalf("type interruptible: is_bid %v", rows[0]["is_bid"])
	}
}

func TestVastPySearchOffersNew(t *testing.T) {
	t.Parallel()
	_, base := newTestServer(t, Options{})
	// `vastai search offers --new 'num_gpus=1' --type bid`
	r := call(t, "PUT", base+"/api/v0/search/asks/", testKey,
		`{"select_cols": ["*"], "q": `+cliBidSearch(`"num_gpus": {"eq": "1"}`)+`}`)
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q: vast.py refuses anything but application/json", ct)
	}
	rows := offersOf(t, r)
	if len(rows) == 0 {
		t.Fatal("search --new found nothing")
	}
	for _, o := range rows {
		if o["num_gpus"].(float64) != 1 || o["is_bid"] != true {
			t.Fatalf("row %v %v", o["num_gpus"], o["is_bid"])
		}
	}
}

func TestVastPyBidLifecycle(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Market: &Market{}})
	o := s.Offers()[5] // an RTX 4090
	// `vastai create instance ID --image pytorch/pytorch --disk 20 --bid_price P`
	bid := round6(o.MinBid * 1.5)
	r := call(t, "PUT", base+"/api/v0/asks/"+itoa(o.ID)+"/", testKey,
		strings.Replace(cliCreate(""), `"price": null`, fmt.Sprintf(`"price": %v`, bid), 1))
	if r.Status != http.StatusOK {
		t.Fatalf("create --bid_price: HTTP %d %s", r.Status, r.Body)
	}
	id := int64(r.JSON(t)["new_contract"].(float64))
	if in, _ := s.Instance(id); !in.IsBid || in.Bid != bid || in.Status != "running" {
		t.Fatalf("bid instance %+v", in)
	}
	show := func() map[string]any {
		return call(t, "GET", base+"/api/v0/instances/"+itoa(id)+"/?owner=me", testKey, nil).JSON(t)["instances"].(map[string]any)
	}
	if m := show(); m["is_bid"] != true || !near(m["dph_total"].(float64), bid+m["storage_total_cost"].(float64)) {
		t.Fatalf("show instance: is_bid %v dph_total %v", m["is_bid"], m["dph_total"])
	}

	// `vastai change bid ID --price P`: vast.py calls r.json() on the reply.
	clock.Add(time.Hour)
	r = call(t, "PUT", base+"/api/v0/instances/bid_price/"+itoa(id)+"/", testKey, fmt.Sprintf(`{"client_id": "me", "price": %v}`, 2*bid))
	if r.Status != http.StatusOK || r.JSON(t)["success"] != true {
		t.Fatalf("change bid: HTTP %d %s", r.Status, r.Body)
	}
	clock.Add(time.Hour)
	if in, _ := s.Instance(id); in.Bid != 2*bid || !near(in.Charged, bid+2*bid+2*o.StorageCost*20/720) {
		t.Fatalf("after change bid: bid %v charged %v, want an hour at each bid plus storage", in.Bid, in.Charged)
	}
	// Without --price vast.py sends null: the winning bid (min_bid here).
	r = call(t, "PUT", base+"/api/v0/instances/bid_price/"+itoa(id)+"/", testKey, `{"client_id": "me", "price": null}`)
	if in, _ := s.Instance(id); r.Status != http.StatusOK || in.Bid != s.Offers()[5].MinBid {
		t.Fatalf("change bid to null: HTTP %d, bid %v, want min_bid %v", r.Status, in.Bid, s.Offers()[5].MinBid)
	}

	// `vastai reboot instance ID`: rebooting, then running; GPU time bills on.
	r = call(t, "PUT", base+"/api/v0/instances/reboot/"+itoa(id)+"/", testKey, `{}`)
	if r.Status != http.StatusOK || r.JSON(t)["success"] != true {
		t.Fatalf("reboot: HTTP %d %s", r.Status, r.Body)
	}
	if m := show(); m["actual_status"] != "rebooting" {
		t.Fatalf("after reboot: actual_status %v", m["actual_status"])
	}
	before, _ := s.Instance(id)
	clock.Add(time.Minute)
	if m := show(); m["actual_status"] != "running" {
		t.Fatalf("a minute after reboot: actual_status %v", m["actual_status"])
	}
	if after, _ := s.Instance(id); !(after.Charged-before.Charged > 0.9*after.Bid/60) {
		t.Fatalf("reboot stopped GPU billing: %v then %v", before.Charged, after.Charged)
	}

	// `vastai logs ID --tail 100`, then the client GETs result_url with no key.
	for _, tc := range []struct{ body, want string }{
		{`{"tail": "100"}`, "container started"},
		{`{"tail": "100", "daemon_logs": "true"}`, "rebooting"},
		{`{"filter": "bid", "tail": "1", "daemon_logs": "true"}`, "bid changed"},
	} {
		r = call(t, "PUT", base+"/api/v0/instances/request_logs/"+itoa(id)+"/", testKey, tc.body)
		if r.Status != http.StatusOK {
			t.Fatalf("logs %s: HTTP %d %s", tc.body, r.Status, r.Body)
		}
		res, err := http.Get(r.JSON(t)["result_url"].(string))
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(text), tc.want) {
			t.Fatalf("logs %s: HTTP %d %q, want a line with %q", tc.body, res.StatusCode, text, tc.want)
		}
		if strings.Contains(tc.body, `"tail": "1"`) && strings.Count(strings.TrimSpace(string(text)), "\n") != 0 {
			t.Fatalf("tail 1 gave %q", text)
		}
	}
	// An on-demand instance has no bid to change.
	od := call(t, "PUT", base+"/api/v0/asks/"+itoa(s.Offers()[0].ID)+"/", testKey, cliCreate(""))
	odID := int64(od.JSON(t)["new_contract"].(float64))
	if r := call(t, "PUT", base+"/api/v0/instances/bid_price/"+itoa(odID)+"/", testKey, `{"client_id": "me", "price": 1}`); r.Status != http.StatusBadRequest {
		t.Fatalf("change bid of an on-demand instance: HTTP %d", r.Status)
	}
	if r := call(t, "PUT", base+"/api/v0/instances/reboot/999/", testKey, `{}`); r.Status != http.StatusNotFound {
		t.Fatalf("reboot of an unknown instance: HTTP %d", r.Status)
	}
}

// formatCharges walks charge results the way vast.py's
// format_invoices_charges_results and create_charges_tree do with
// --charges --verbose, returning the error Python would raise.
func formatCharges(results []any, top bool) error {
	for _, x := range results {
		item, ok := x.(map[string]any)
		if !ok {
			return fmt.Errorf("TypeError: item %v", x)
		}
		for _, k := range []string{"start", "end", "amount", "source", "items", "type", "description"} {
			if _, ok := item[k]; !ok {
				return fmt.Errorf("KeyError(%q) in %v", k, item)
			}
		}
		for _, k := range []string{"start", "end"} {
			if v := item[k]; v != nil {
				if _, ok := v.(float64); !ok {
					return fmt.Errorf("TypeError: %s %v is not a timestamp", k, v)
				}
			}
		}
		if _, ok := item["amount"].(float64); !ok {
			return fmt.Errorf("TypeError: amount %v", item["amount"])
		}
		if src, _ := item["source"].(string); strings.Contains(src, "-") && strings.Count(src, "-") != 1 {
			// item['type'], item['source'] = source.capitalize().split('-')
			return fmt.Errorf("ValueError: too many values to unpack from %q", src)
		}
		if top {
			if _, ok := item["metadata"].(map[string]any); !ok {
				return fmt.Errorf("metadata %v: the table calls .get on it", item["metadata"])
			}
		}
		sub, ok := item["items"].([]any)
		if !ok {
			return fmt.Errorf("TypeError: items %v", item["items"])
		}
		if err := formatCharges(sub, false); err != nil {
			return err
		}
	}
	return nil
}

func TestVastPyShowInvoicesV1(t *testing.T) {
	t.Parallel()
	clock := teststack.NewClock(time.Unix(1_800_000_000, 0))
	// More offers than a page holds, to check the limit.
	var catalog []Offer
	for i := range 3 {
		for _, o := range DefaultCatalog() {
			o.ID += int64(i) * 1_000_000
			o.Rentable = true
			catalog = append(catalog, o)
		}
	}
	s, base := newTestServer(t, Options{StartDelay: -1, Now: clock.Now, Catalog: catalog})
	offers := s.Offers()
	for i := range 101 {
		body := cliCreate("")
		if i%2 == 1 {
			body = strings.Replace(body, `"price": null`, fmt.Sprintf(`"price": %v`, offers[i].MinBid+0.05), 1)
		}
		if r := call(t, "PUT", base+"/api/v0/asks/"+itoa(offers[i].ID)+"/", testKey, body); r.Status != http.StatusOK {
			t.Fatalf("create %d: HTTP %d %s", i, r.Status, r.Body)
		}
	}
	clock.Add(3 * time.Hour)
	end := clock.Now().Unix()
	start := end - 7*24*3600
	filters := fmt.Sprintf(`{"day": {"gte": %d, "lte": %d}}`, start, end)

	// `vastai show invoices-v1 --charges --verbose` (limit 20, the default)
	r := call(t, "GET", base+"/api/v0/charges/?"+pyQuery("select_filters", filters, "latest_first", "false",
		"limit", "20", "format", "table"), testKey, nil)
	m := r.JSON(t)
	results, _ := m["results"].([]any)
	if r.Status != http.StatusOK || len(results) != 20 || m["total"].(float64) != 101 || m["next_token"] == nil {
		t.Fatalf("charges: HTTP %d, %d results of %v, next %v", r.Status, len(results), m["total"], m["next_token"])
	}
	if err := formatCharges(results, true); err != nil {
		t.Fatalf("vast.py's --verbose formatter would fail: %v", err)
	}
	// --charge-type i --latest-first --format tree --limit 500: 100 at most.
	withType := fmt.Sprintf(`{"day": {"gte": %d, "lte": %d}, "type": {"in": ["instance"]}}`, start, end)
	r = call(t, "GET", base+"/api/v0/charges/?"+pyQuery("select_filters", withType, "latest_first", "true",
		"limit", "500", "format", "tree"), testKey, nil)
	m = r.JSON(t)
	results, _ = m["results"].([]any)
	if len(results) != pageMax || m["count"].(float64) != pageMax {
		t.Fatalf("limit 500: %d results (count %v), want %d", len(results), m["count"], pageMax)
	}
	if err := formatCharges(results, true); err != nil {
		t.Fatalf("vast.py's tree formatter would fail: %v", err)
	}
	if src := results[0].(map[string]any)["source"]; src != fmt.Sprintf("instance-%d", firstInstanceID+100) {
		t.Fatalf("latest first: first source %v", src)
	}
	// The next page, with the token as vast.py passes it (a string).
	r = call(t, "GET", base+"/api/v0/charges/?"+pyQuery("select_filters", withType, "latest_first", "true",
		"limit", "100", "format", "tree", "after_token", m["next_token"].(string)), testKey, nil)
	if rest := r.JSON(t)["results"].([]any); len(rest) != 1 {
		t.Fatalf("second page: %d results, want 1", len(rest))
	}

	// `vastai show invoices-v1 --invoices`: the starting credit.
	inv := fmt.Sprintf(`{"when": {"gte": %d, "lte": %d}}`, start, end)
	r = call(t, "GET", base+"/api/v1/invoices/?"+pyQuery("select_filters", inv, "latest_first", "false", "limit", "20"), testKey, nil)
	m = r.JSON(t)
	results, _ = m["results"].([]any)
	if r.Status != http.StatusOK || m["success"] != true || len(results) != 1 {
		t.Fatalf("invoices: HTTP %d %s", r.Status, r.Body)
	}
	if err := formatCharges(results, true); err != nil {
		t.Fatalf("invoice shape: %v", err)
	}
	if md := results[0].(map[string]any)["metadata"].(map[string]any); md["invoice_id"] == nil {
		t.Fatalf("invoice metadata %v: the invoices table reads invoice_id", md)
	}
	bad := fmt.Sprintf(`{"when": {"gte": %d, "lte": %d}}`, end, start)
	if m := call(t, "GET", base+"/api/v1/invoices/?"+pyQuery("select_filters", bad, "limit", "20"), testKey, nil).JSON(t); m["success"] != false || m["error"] != "Invalid date range" {
		t.Fatalf("reversed range: %v", m)
	}
}
