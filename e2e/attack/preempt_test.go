package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// The preemption wave (issue 33): interruptible instances rented by spec
// (market interruptible, a bid) on account atk-bid, with every wave's
// burst, while the simulator's market preempts every interruptible
// instance of ours on a schedule (a trace of "preempt" events: someone
// rents their machines on demand for preemptHold, then they resume by
// themselves). The chaos strikes meanwhile. Half of what is rented is
// destroyed a few seconds later, preempted or not; the rest once the
// waves, the lifetimes' wait and the partition are over (about 25 s in
// ci). The invariants are the harness's (no window over its limit,
// no orphan, no duplicate row, no leaked GPU); the wave adds that they
// hold for preempted instances: the poller recorded preemptions with
// vast.ai's message (and resumes), a preempted row has no open meter (the
// ledger check), an instance preempted while gpuproxy knew it is never
// an orphan, and every destroyed one is gone at the simulator.

const (
	preemptAccount = "atk-bid"
	// preemptCap is the spec's max_price_per_hour: the bid plus storage
	// stays under it.
	preemptCap = 2.0
	// preemptEvery and preemptHold schedule the market's preemptions:
	// every preemptEvery, each interruptible instance of ours is
	// outranked for preemptHold, then resumes (a start of simStart).
	preemptEvery = 3 * time.Second
	preemptHold  = time.Second
	// preemptSpan is how long the trace goes on: longer than any run.
	preemptSpan = 30 * time.Minute
	// preemptTick is the simulator market's step.
	preemptTick = 250 * time.Millisecond
	// preemptKeepPct of the instances rented are kept until the waves,
	// the lifetimes' wait and the partition are over; the others are
	// destroyed preemptDestroyAfter (±50%) after.
	preemptKeepPct      = 50
	preemptDestroyAfter = 3 * time.Second
	// preemptSends bounds how often one create is sent; a 409 saying it
	// still runs elsewhere is asked again after preemptRunningWait.
	preemptSends       = 8
	preemptRunningWait = 1500 * time.Millisecond
	// preemptSvcDrain bounds the wait for a deleted service's replicas
	// to be destroyed.
	preemptSvcDrain = 20 * time.Second
	// preemptWatchEvery is how often the watcher reads atk-bid's rows.
	preemptWatchEvery = 100 * time.Millisecond
)

// preemptGPUs are the models the wave bids on: none of the service's
// (RTX 4090, A6000, 5090), so that the service's window, fitted to its
// spec's offers, is not moved by this wave's rents. The by-spec herd
// contests the same machines.
var preemptGPUs = []string{"RTX 3080", "RTX 3090", "RTX A5000", "L4", "L40S", "A100", "H100", "H200"}

// preemptLimits are atk-bid's windows: room for several bids at once.
var preemptLimits = []keyWindow{{60, 6}, {1440, 60}}

// specFloor is how many single-GPU offers of each by-spec model outside
// the service's spec the market keeps listed.
const specFloor = 1

// preemptSimFlags writes the market's trace into dir and returns the
// simulator flags of the wave: a market that only preempts, on the
// trace's schedule (no hazard, prices fixed, no hosts coming or going,
// io.net's capacity fixed), so the other phases meet the market they
// always did, except that the by-spec herd's machines come back (a floor
// of specFloor singles of each of its models outside the service's).
func preemptSimFlags(dir string) ([][2]string, error) {
	var b strings.Builder
	// The by-spec herd, this wave and its service rent the same cheap
	// single-GPU machines, and none came back: a run could drain them
	// before the herd rented any (it then tested nothing). One single of
	// each of the herd's models outside the service's spec stays listed;
	// the service's models get no floor, so its window, fitted to the
	// offers it saw, still admits exactly two replicas.
	for _, gpu := range specGPUs {
		if !slices.Contains(svcGPUs, gpu) {
			fmt.Fprintf(&b, `{"at":"0s","kind":"supply","gpu":%q,"value":%d}`+"\n", gpu, specFloor)
		}
	}
	for at := preemptEvery; at < preemptSpan; at += preemptEvery {
		fmt.Fprintf(&b, `{"at":%q,"kind":"preempt","value":%g}`+"\n", at.String(), preemptHold.Seconds())
	}
	path := filepath.Join(dir, "market-trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	return [][2]string{{"--market-trace", path}, {"--market-tick", preemptTick.String()}, {"--preempt-hazard", "0"},
		{"--price-walk", "0"}, {"--host-rate", "0"}, {"--min-singles", "0"}, {"--min-per-size", "0"},
		{"--capacity-walk", "0"}}, nil
}

// setUpPreemptAccount creates atk-bid with its windows, a credit and an
// assistant key, and returns the key.
func setUpPreemptAccount(run func(args ...string) string) string {
	run("accounts", "create", preemptAccount)
	args := []string{"limits", "set", "--account", preemptAccount}
	for _, w := range preemptLimits {
		args = append(args, "--window", w.String())
	}
	run(args...)
	run("credits", "add", "--account", preemptAccount, "--amount", "1000")
	return lastLine(run("keys", "create", "--account", preemptAccount, "--preset", "assistant", "--name", "attack bid"))
}

// preemptCall is one interruptible create as its client saw it.
type preemptCall struct {
	idem  string
	sent  int // times sent
	final reply
	inst  instance
}

// rented reports whether the client was told of an instance.
func (c preemptCall) rented() bool {
	return (c.final.status == http.StatusCreated || c.final.status == http.StatusAccepted) && c.inst.ID != ""
}

// unfinished reports whether the call's last answer was a 202 (pending:
// its outcome was not known then, e.g. the database went away while it
// recorded a failed attempt) for an instance that never reached the
// provider. Its key must then have rented nothing (checked by the caller).
func (c preemptCall) unfinished(rows map[string]*instanceRow) bool {
	in := rows[c.inst.ID]
	return c.final.status == http.StatusAccepted && in != nil && in.providerID == ""
}

// preemptLoad is the wave's state: its key, its calls, the instances
// kept for the end, the destroys, the watcher's histories and its
// service of interruptible replicas.
type preemptLoad struct {
	key   string
	watch *preemptWatch
	// svcID is the service placed on the interruptible market ("" when
	// the build has no placements: svcWhy says why); svcDeleted its
	// DELETE's answer, svcGone whether its replicas were all destroyed
	// within preemptSvcDrain.
	svcID, svcWhy string
	svcDeleted    reply
	svcGone       bool

	mu        sync.Mutex
	calls     []preemptCall
	kept      []string
	destroyed map[string]reply // by instance id: the destroy's answer
	destroyWG sync.WaitGroup
}

func newPreemptLoad(key string) *preemptLoad {
	return &preemptLoad{key: key, watch: &preemptWatch{}, destroyed: map[string]reply{}}
}

// start sends this wave's n interruptible creates once the gate opens.
func (p *preemptLoad) start(ctx context.Context, a *api, wave, n int, gate <-chan struct{}, wg *sync.WaitGroup,
	prog *progress) {
	for i := range n {
		idx := wave*n + i
		wg.Go(func() {
			<-gate
			c := p.create(ctx, a, idx)
			prog.done.Add(1)
			p.mu.Lock()
			p.calls = append(p.calls, c)
			p.mu.Unlock()
			if !c.rented() {
				return
			}
			if rand.IntN(100) < preemptKeepPct {
				p.mu.Lock()
				p.kept = append(p.kept, c.inst.ID)
				p.mu.Unlock()
				return
			}
			p.destroyWG.Go(func() {
				// pace: held a while, through a preemption or two.
				time.Sleep(preemptDestroyAfter/2 + time.Duration(rand.Int64N(int64(preemptDestroyAfter))))
				p.destroy(ctx, a, idx, c.inst.ID)
			})
		})
	}
}

// create rents one interruptible instance by spec, with its own
// Idempotency-Key, sent again to the next replica while the outcome is
// unknown (a transport error, a 5xx, a 409 saying it still runs).
func (p *preemptLoad) create(ctx context.Context, a *api, n int) preemptCall {
	body := map[string]any{"image": "vllm/vllm-openai:latest", "ports": []int{8000},
		"spec": map[string]any{"gpu": preemptGPUs, "num_gpus": 1, "max_price_per_hour": preemptCap,
			"providers": "vast.ai", "market": "interruptible", "max_attempts": 5}}
	c := preemptCall{idem: fmt.Sprintf("bid-%d", n)}
	for c.sent < preemptSends {
		c.sent++
		c.final = a.do(ctx, n+c.sent, http.MethodPost, "/api/v1/gpu/instances", p.key, body,
			map[string]string{"Idempotency-Key": c.idem})
		running := c.final.status == http.StatusConflict && c.final.errorCode() == "conflict"
		if ctx.Err() != nil || !(c.final.retryable() || running) {
			break
		}
		wait := time.Duration(300+rand.IntN(400)) * time.Millisecond
		if running {
			wait = preemptRunningWait
		}
		// pace: a client's retry backoff; longer while the call still
		// runs elsewhere (its answer says when to come back).
		time.Sleep(wait)
	}
	if c.final.status == http.StatusCreated || c.final.status == http.StatusAccepted {
		_ = json.Unmarshal(c.final.body, &c.inst)
	}
	return c
}

// destroy destroys one of the wave's instances and records the answer.
func (p *preemptLoad) destroy(ctx context.Context, a *api, replica int, id string) {
	r := a.destroy(ctx, replica, p.key, id)
	p.mu.Lock()
	p.destroyed[id] = r
	p.mu.Unlock()
}

// finish destroys what was kept and deletes the service, once the other
// phases are over, and waits for every destroy and for the service's
// replicas to be gone.
func (p *preemptLoad) finish(ctx context.Context, a *api) {
	p.mu.Lock()
	kept := slices.Clone(p.kept)
	p.mu.Unlock()
	for i, id := range kept {
		p.destroyWG.Go(func() { p.destroy(ctx, a, i, id) })
	}
	p.destroyWG.Wait()
	if p.svcID == "" {
		return
	}
	for try := range 6 {
		p.svcDeleted = a.do(ctx, try, http.MethodDelete, "/api/v1/services/"+p.svcID, p.key, nil, nil)
		if !p.svcDeleted.retryable() {
			break
		}
	}
	// Deleting drains and destroys its replicas, the controller's work.
	p.svcGone = testpoll.WaitEvery(preemptSvcDrain, 250*time.Millisecond, func() bool {
		r := a.do(ctx, 0, http.MethodGet, "/api/v1/gpu/instances", p.key, nil, nil)
		var l struct {
			Instances []instance `json:"instances"`
		}
		if r.status != http.StatusOK || json.Unmarshal(r.body, &l) != nil {
			return false
		}
		return !slices.ContainsFunc(l.Instances, func(in instance) bool {
			return in.Status != "terminated" && in.Status != "failed"
		})
	})
}

// startService creates atk-bid's service of interruptible replicas
// (placement interruptible: one replica for the load and one more, the
// default overprovision), rented by spec on the wave's models; a build
// without placements (no services, or placement refused) runs without
// it, and says so in svcWhy.
func (p *preemptLoad) startService(ctx context.Context, a *api) error {
	body := map[string]any{"name": "atk-bid-svc", "model": "atk-bid-model", "image": "vllm/vllm-openai:latest",
		"port": 8000, "placement": "interruptible",
		"spec": map[string]any{"gpu": preemptGPUs, "num_gpus": 1, "max_price_per_hour": preemptCap,
			"providers": "vast.ai", "max_attempts": 5},
		"replicas": map[string]any{"min": 1, "max": 2}}
	var r reply
	for try := range 6 {
		r = a.do(ctx, try, http.MethodPost, "/api/v1/services", p.key, body, nil)
		if !r.retryable() {
			break
		}
	}
	var v struct {
		ID string `json:"id"`
	}
	switch {
	case r.status == http.StatusCreated && json.Unmarshal(r.body, &v) == nil && v.ID != "":
		p.svcID = v.ID
		return nil
	case r.status == http.StatusNotFound || r.status == http.StatusBadRequest && strings.Contains(string(r.body), "placement"):
		p.svcWhy = "this build has no service placements: " + r.String()
		return nil
	}
	return fmt.Errorf("creating the interruptible service: %s", r)
}

// preemptWatch reads atk-bid's instance rows every preemptWatchEvery:
// each one's statuses in the order seen and the provider's messages.
type preemptWatch struct {
	mu     sync.Mutex
	byID   map[string]*preemptHistory
	errors int
}

// preemptHistory is what the watcher saw of one row.
type preemptHistory struct {
	statuses []string // each change seen, in order
	msgs     []string // status_msg while preempted
}

func (h *preemptHistory) observe(status, msg string) {
	if n := len(h.statuses); n == 0 || h.statuses[n-1] != status {
		h.statuses = append(h.statuses, status)
	}
	if status == "preempted" && msg != "" && !slices.Contains(h.msgs, msg) {
		h.msgs = append(h.msgs, msg)
	}
}

const preemptWatchSQL = `SELECT i.id, i.status, i.status_msg FROM instances i JOIN accounts a ON a.id = i.account_id
	WHERE a.name = $1`

func (w *preemptWatch) run(ctx context.Context, url string) {
	watchDB(ctx, url, preemptWatchEvery, w.failed, w.poll)
}

func (w *preemptWatch) failed() {
	w.mu.Lock()
	w.errors++
	w.mu.Unlock()
}

func (w *preemptWatch) poll(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, preemptWatchSQL, preemptAccount)
	if err != nil {
		return err
	}
	defer rows.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byID == nil {
		w.byID = map[string]*preemptHistory{}
	}
	for rows.Next() {
		var id, status, msg string
		if err := rows.Scan(&id, &status, &msg); err != nil {
			return err
		}
		h := w.byID[id]
		if h == nil {
			h = &preemptHistory{}
			w.byID[id] = h
		}
		h.observe(status, msg)
	}
	return rows.Err()
}

// histories returns a copy of what the watcher saw, by row id.
func (w *preemptWatch) histories() map[string]preemptHistory {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]preemptHistory{}
	for id, h := range w.byID {
		out[id] = preemptHistory{statuses: slices.Clone(h.statuses), msgs: slices.Clone(h.msgs)}
	}
	return out
}

// preemptRun is what the wave's check reads: the calls, the destroys'
// answers, the watcher's histories, the final database state and the
// simulators' instances.
type preemptRun struct {
	calls     []preemptCall
	svcID     string // the service of interruptible replicas, "" for none
	svcGone   bool   // its replicas were destroyed once it was deleted
	svcDelete reply
	destroyed map[string]reply
	seen      map[string]preemptHistory
	s         *dbState
	pis       []providerInstance
}

// preemptFigures sums the wave up.
type preemptFigures struct {
	sent, rented, refused, noMatch, other int
	pending                               int    // 202s for instances that never reached vast.ai
	otherExample                          string // the first other answer
	resent                                int
	rows, preempted, resumed, msgs        int
	destroyedWhilePreempted               int
	destroys                              *tally
	svcReplicas, svcPreempted             int // the service's rents, and those seen preempted
}

func (f preemptFigures) String() string {
	return fmt.Sprintf("preemption wave (%s): %d interruptible creates by spec (%d re-sends): %d rented, %d pending (202, never rented), "+
		"%d refused (402), %d no_matching_offer, %d other (%s); %d rows; the poller recorded %d preempted (%d with vast.ai's message), "+
		"%d resumed; %d destroyed while preempted; destroys: %s; its interruptible service rented %d replicas, %d seen preempted",
		preemptAccount, f.sent, f.resent, f.rented, f.pending, f.refused, f.noMatch, f.other, cmpOr(f.otherExample, "none"), f.rows,
		f.preempted, f.msgs, f.resumed, f.destroyedWhilePreempted, f.destroys.String(), f.svcReplicas, f.svcPreempted)
}

// check holds the wave to its promises and returns its figures.
func (r preemptRun) check(v *violations) preemptFigures {
	f := preemptFigures{destroys: &tally{}}
	acct := r.s.byName[preemptAccount]
	if acct == nil {
		v.add("preemption wave: account %s missing", preemptAccount)
		return f
	}
	// The calls: each key rented at most one instance, the one its
	// client was told of.
	rows := map[string]*instanceRow{}
	for _, in := range r.s.instances {
		if in.account == acct.id {
			rows[in.id] = in
		}
	}
	f.rows = len(rows)
	for _, c := range r.calls {
		f.sent++
		f.resent += c.sent - 1
		var rentedRows []string
		for _, in := range rows {
			if strings.HasPrefix(in.idemKey, c.idem+"#") && in.providerID != "" {
				rentedRows = append(rentedRows, in.id)
			}
		}
		sort.Strings(rentedRows)
		pending := c.unfinished(rows) && len(rentedRows) == 0
		switch {
		case pending:
			f.pending++
		case c.rented():
			f.rented++
		case c.final.status == http.StatusPaymentRequired:
			f.refused++
		case c.final.errorCode() == "no_matching_offer":
			f.noMatch++
		default:
			f.other++
			f.otherExample = cmpOr(f.otherExample, c.final.String())
		}
		if len(rentedRows) > 1 {
			v.add("preemption wave: Idempotency-Key %s rented %d instances: %v", c.idem, len(rentedRows), rentedRows)
		}
		if c.rented() && !pending {
			if in := rows[c.inst.ID]; in == nil {
				v.add("preemption wave: create %s answered instance %s, which has no row", c.idem, c.inst.ID)
			} else if !slices.Contains(rentedRows, in.id) {
				v.add("preemption wave: create %s answered instance %s, not the one its key rented (%v)", c.idem, in.id, rentedRows)
			}
		}
	}
	if f.rented == 0 {
		v.add("preemption wave: nothing was rented (%d creates: %d refused, %d no_matching_offer, %d other)",
			f.sent, f.refused, f.noMatch, f.other)
	}
	// The rows: bids under the cap, preemptions recorded, all destroyed
	// and gone at the simulator.
	listed := map[string]providerInstance{}
	for _, pi := range r.pis {
		if pi.provider == "vast.ai" {
			listed[pi.id] = pi
		}
	}
	for _, in := range rows {
		if in.providerID == "" {
			continue // an attempt that rented nothing
		}
		if r.s.hasMarket && in.market != "interruptible" {
			v.add("preemption wave: instance %s rented on market %q, the spec asked for interruptible", in.id, in.market)
		}
		if in.price > int64(preemptCap*1e6) {
			v.add("preemption wave: instance %s admitted at %s/h, over the spec's cap $%g", in.id, usd(in.price), preemptCap)
		}
		h := r.seen[in.id]
		svc := r.svcID != "" && strings.HasPrefix(in.idemKey, "service:"+r.svcID+":")
		if svc {
			f.svcReplicas++
		}
		if i := slices.Index(h.statuses, "preempted"); i >= 0 {
			f.preempted++
			if svc {
				f.svcPreempted++
			}
			if slices.Contains(h.statuses[i:], "running") {
				f.resumed++
			}
			if len(h.msgs) > 0 {
				f.msgs++
			}
			// Preempted when its destroy began: the status before the
			// first terminating (or terminated) one seen.
			if j := slices.IndexFunc(h.statuses, func(st string) bool { return st == "terminating" || st == "terminated" }); j > 0 &&
				h.statuses[j-1] == "preempted" {
				f.destroyedWhilePreempted++
			}
		}
		switch in.status {
		case "terminated", "failed":
		default:
			v.add("preemption wave: instance %s is %s at the end; every one was destroyed", in.id, in.status)
		}
		if pi, ok := listed[in.providerID]; ok && pi.tag == in.id && (in.status == "terminated" || in.status == "failed") {
			v.add("leaked GPU: instance %s is %s here, but vast.ai still lists %s (%s)", in.id, in.status, pi.id,
				cmpOr(pi.status, "null"))
		}
	}
	if f.rented > 0 && f.preempted == 0 {
		v.add("preemption wave: the market preempted none of the %d interruptible instances the poller watched", f.rented)
	}
	if f.preempted > 0 && f.msgs == 0 {
		v.add("preemption wave: %d preemptions recorded, none with the provider's message", f.preempted)
	}
	if r.svcID != "" {
		if f.svcReplicas == 0 {
			v.add("preemption wave: service %s rented no replica", r.svcID)
		}
		if r.svcDelete.err != nil || r.svcDelete.status/100 != 2 {
			v.add("preemption wave: deleting service %s answered %s", r.svcID, r.svcDelete)
		}
		if !r.svcGone {
			v.add("preemption wave: service %s deleted, but its replicas were not all destroyed within %s", r.svcID,
				preemptSvcDrain)
		}
	}
	for id, d := range r.destroyed {
		f.destroys.add(outcome(d))
		if d.err != nil || d.status != http.StatusOK {
			v.add("preemption wave: destroying %s answered %s", id, d)
		}
	}
	return f
}

// cmpOr is s, or def when s is empty.
func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
