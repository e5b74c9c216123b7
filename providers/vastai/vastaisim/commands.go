package vastaisim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file serves the instance commands beyond create, show, manage and
// destroy, as vast.py sends them: change bid, reboot, logs (with the
// result_url the client then fetches without a key) and the invoices list.

// changeBid answers PUT /api/v0/instances/bid_price/{id}/ with body
// {"client_id":"me","price":X} (vast.py's `change bid ID --price X`). A
// null price takes the winning bid: the current min_bid, or just above
// the bid that outranks it. Only an interruptible instance has a bid (on
// vast.ai the rental type cannot change once rented). With a market the
// new bid takes effect at once: a winning bid resumes a paused instance,
// a losing one pauses a running one.
func (s *Server) changeBid(w http.ResponseWriter, _ *http.Request, body []byte, id int64) {
	var req struct {
		ClientID string   `json:"client_id"`
		Price    *float64 `json:"price"`
	}
	if len(strings.TrimSpace(string(body))) > 0 && json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "invalid_args", "Invalid json body")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.lookup(id)
	if err != nil {
		writeError(w, http.StatusNotFound, "no_such_instance", fmt.Sprintf("Instance %d not found.", id))
		return
	}
	if !in.isBid {
		writeError(w, http.StatusBadRequest, "invalid_args",
			fmt.Sprintf("instance %d is on-demand: only an interruptible instance has a bid", id))
		return
	}
	now := s.now()
	price := s.winningBid(in, now)
	if req.Price != nil {
		price = *req.Price
	}
	if math.IsNaN(price) || price < 0.001 || price > 128 {
		writeError(w, http.StatusBadRequest, "invalid_price", "price must be between 0.001 and 128")
		return
	}
	// GPU time billed so far stays at the old bid.
	in.endRun(now)
	if in.intended == "running" && !in.paused && !in.phaseStart.IsZero() {
		in.runFrom = later(now, in.phaseStart.Add(s.opts.StartDelay))
	}
	in.bid = round6(price)
	in.logf(now, true, "instance %d bid changed to $%.4f/hr", id, in.bid)
	if s.mkt != nil {
		s.settleOne(in, now)
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true,
		"msg": fmt.Sprintf("bid price for instance %d changed to %g", id, in.bid)})
}

// winningBid is the lowest bid that wins in's machine now: the minimum
// bid, or a tenth of a cent above the bid that outranks it.
func (s *Server) winningBid(in *instance, now time.Time) float64 {
	p := in.offer.MinBid
	if o := s.offers[in.offer.ID]; o != nil {
		p = o.MinBid
	}
	if s.mkt != nil {
		if c, ok := s.mkt.claims[in.offer.MachineID]; ok && now.Before(c.until) && !c.onDemand {
			p = math.Max(p, c.bid+0.001)
		}
	}
	return round6(math.Max(p, 0.001))
}

// rebootInstance answers PUT /api/v0/instances/reboot/{id}/ (body {}):
// the container restarts ("rebooting" for a third of StartDelay) without
// losing GPU priority, so GPU billing goes on. Only a running instance
// reboots.
func (s *Server) rebootInstance(w http.ResponseWriter, _ *http.Request, _ []byte, id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.lookup(id)
	if err != nil {
		writeError(w, http.StatusNotFound, "no_such_instance", fmt.Sprintf("Instance %d not found.", id))
		return
	}
	if st := s.status(in); st != "running" {
		if st == "" {
			st = "starting"
		}
		writeError(w, http.StatusBadRequest, "invalid_args",
			fmt.Sprintf("instance %d is %s: only a running instance reboots", id, st))
		return
	}
	now := s.now()
	in.rebootEnd = now.Add(max(s.opts.StartDelay/3, time.Millisecond))
	in.stopInference()
	in.logf(now, true, "instance %d rebooting", id)
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "msg": fmt.Sprintf("Rebooting instance %d.", id)})
}

// logsPath is where result_urls of the logs endpoint point; the simulator
// serves them without a key, as vast.ai's are presigned.
const logsPath = "/sim/instance-logs/"

// maxLogResults bounds the kept log results.
const maxLogResults = 256

// defaultLogTail is the lines a logs request without tail returns.
const defaultLogTail = 1000

// requestLogs answers PUT /api/v0/instances/request_logs/{id}/ with body
// {"tail":"100","filter":"text","daemon_logs":"true"} (all optional, as
// vast.py sends them): 200 {"success":true,"result_url":...}; a GET of
// result_url returns the last tail lines (the container's, or with
// daemon_logs the host daemon's) containing filter.
func (s *Server) requestLogs(w http.ResponseWriter, r *http.Request, body []byte, id int64) {
	var req struct {
		Tail       any    `json:"tail"`
		Filter     string `json:"filter"`
		DaemonLogs any    `json:"daemon_logs"`
	}
	if len(strings.TrimSpace(string(body))) > 0 && json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "invalid_args", "Invalid json body")
		return
	}
	tail := defaultLogTail
	if req.Tail != nil {
		n, ok := numberOf(req.Tail)
		if !ok || n < 0 || n != math.Trunc(n) {
			writeError(w, http.StatusBadRequest, "invalid_args", fmt.Sprintf("tail must be a number of lines, got %v", req.Tail))
			return
		}
		tail = int(n)
	}
	daemon := req.DaemonLogs == true || req.DaemonLogs == "true"
	s.mu.Lock()
	in, err := s.lookup(id)
	if err != nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "no_such_instance", fmt.Sprintf("Instance %d not found.", id))
		return
	}
	s.status(in)
	var lines []string
	for _, l := range in.events {
		if l.daemon == daemon && strings.Contains(l.text, req.Filter) {
			lines = append(lines, l.at.UTC().Format(time.RFC3339)+" "+l.text)
		}
	}
	if len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	tok := randomHex(16)
	s.logs[tok] = strings.Join(lines, "\n") + "\n"
	s.logOrder = append(s.logOrder, tok)
	if len(s.logOrder) > maxLogResults {
		delete(s.logs, s.logOrder[0])
		s.logOrder = s.logOrder[1:]
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true,
		"result_url": "http://" + r.Host + logsPath + tok,
		"msg":        "Fetching logs, the result will be at result_url."})
}

// serveLogs answers a GET of a logs result_url with the text, or 404.
func (s *Server) serveLogs(w http.ResponseWriter, tok string) {
	s.mu.Lock()
	text, ok := s.logs[tok]
	s.mu.Unlock()
	if !ok {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(text))
}

// Paging of GET /api/v1/invoices/: limit defaults to invoicesPageDefault
// and is capped at pageMax, as the charges' is.
const invoicesPageDefault = 60

// showInvoices answers GET /api/v1/invoices/ (vast.py's `show
// invoices-v1 --invoices`): select_filters with a "when" range in unix
// seconds is required (a bad range is HTTP 200 with success false, as
// vast.ai answers). The simulated account has one invoice: its starting
// credit, a "credit" from Stripe at the simulator's start. Its amount is
// negative, as vast.py negates every amount but transfers' and payouts'
// to show it "as related to balance".
func (s *Server) showInvoices(w http.ResponseWriter, r *http.Request, _ []byte, _ int64) {
	v, _ := queryJSON(r, "select_filters")
	sf, _ := v.(map[string]any)
	when, _ := sf["when"].(map[string]any)
	gte, ok1 := numberOf(when["gte"])
	lte, ok2 := numberOf(when["lte"])
	if !ok1 || !ok2 || gte > lte {
		writeJSON(w, http.StatusOK, map[string]any{"success": false, "error": "Invalid date range",
			"msg": "select_filters must hold a when range with gte ≤ lte (unix seconds)"})
		return
	}
	limit, ok := pageLimit(r, invoicesPageDefault)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_args", "limit must be a positive number")
		return
	}
	offset, ok := pageOffset(r)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_token", "Invalid pagination token")
		return
	}
	s.mu.Lock()
	at := float64(s.started.Unix())
	credit := s.opts.Credit
	s.mu.Unlock()
	var results []map[string]any
	wantService := true
	if svc, ok := sf["service"].(map[string]any); ok {
		if in, ok := svc["in"].([]any); ok {
			wantService = false
			for _, x := range in {
				wantService = wantService || x == "stripe_payments"
			}
		}
	}
	if wantService && at >= gte && at <= lte {
		results = append(results, map[string]any{
			"start": at, "end": at, "type": "credit", "source": "stripe",
			"description": "Credit purchase (simulated starting credit)", "amount": -round6(credit),
			"metadata": map[string]any{"invoice_id": 1, "service": "stripe_payments"}, "items": []any{},
		})
	}
	writePage(w, results, offset, limit)
}

// pageMax is the largest page of the charges and invoices endpoints:
// vast.py caps --limit at 100 ("max: 100").
const pageMax = 100

// pageLimit reads the limit query parameter: def when absent, at most
// pageMax; ok is false for a value that is not a positive number.
func pageLimit(r *http.Request, def int) (int, bool) {
	v, present := queryJSON(r, "limit")
	if !present {
		return min(def, pageMax), true
	}
	n, ok := numberOf(v)
	if !ok || n < 1 {
		return 0, false
	}
	return int(math.Min(n, pageMax)), true
}

// pageOffset reads after_token ("off_N"); ok is false for a bad token.
func pageOffset(r *http.Request) (int, bool) {
	v, present := queryJSON(r, "after_token")
	if !present {
		return 0, true
	}
	tok := fmt.Sprint(v)
	n, err := strconv.Atoi(strings.TrimPrefix(tok, "off_"))
	if !strings.HasPrefix(tok, "off_") || err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// writePage writes one page of results in vast.ai's envelope.
func writePage(w http.ResponseWriter, results []map[string]any, offset, limit int) {
	total := len(results)
	offset = min(offset, total)
	page := results[offset:]
	var next any
	if len(page) > limit {
		page = page[:limit]
		next = fmt.Sprintf("off_%d", offset+limit)
	}
	if page == nil {
		page = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "count": len(page), "total": total,
		"next_token": next, "results": page})
}
