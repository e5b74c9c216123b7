package attack

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// report gathers the run's figures for the summary printed at the end.
type report struct {
	mu       sync.Mutex
	mode     string
	sz       size
	bin      string
	replicas int

	creates                     []createResult
	createOut                   tally
	admittedUSD                 map[string]float64 // provider → what admitted creates were asked to hold
	admittedN                   map[string]int
	destroys                    tally
	proxy                       tally
	chaos                       []string
	marks                       []chaosMark
	proxyPrior                  int64
	proxyLimit                  int64
	proxyCharged                int64
	proxyServed                 int
	proxyByProc                 tally // 2xx proxy replies by answering process
	killedProcs                 []string
	proxyByKilled, proxyUnknown int
	keys                        keySet
	hasKeys                     bool
	waves                       int
	keyProxies                  []keyProxy
	spec                        *specLoad // nil: the build has no rent by spec
	specFigures                 *specFigures
	idle                        *idleLoad // nil: the build has no lifetimes
	lifetime                    *lifetimeFigures
	svc                         *serviceLoad // nil: the build has no services
	svcFigures                  *serviceFigures
	tok                         *tokenLoad // nil: the build has no account token prices
	tokFigures                  *tokenFigures
	partFigures                 *partitionFigures // the partition phase's (nil: none ran)
	partProc                    string            // the process it cut

	lifetimeWait time.Duration

	attackTime, settleTime, wall time.Duration
	leasesLive                   int
	final                        []windowFigures
	final2                       *dbState
	peak, confirmed              map[string]windowFigures
	samples, sampleErrs          int
	providerLive, providerAll    int
	violations                   []string
}

func (r *report) addCreate(res createResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.creates = append(r.creates, res)
	r.createOut.add(res.provider + " " + outcome(res.final))
	if res.inst.ID != "" {
		if r.admittedUSD == nil {
			r.admittedUSD, r.admittedN = map[string]float64{}, map[string]int{}
		}
		r.admittedUSD[res.provider] += res.cost
		r.admittedN[res.provider]++
	}
}

func (r *report) addChaos(s string, m chaosMark) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chaos = append(r.chaos, s)
	r.marks = append(r.marks, m)
}

// served counts replies with a 2xx status.
func (t *tally) served() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, c := range t.m {
		if strings.HasPrefix(k, "2") {
			n += c
		}
	}
	return n
}

func (r *report) String() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("")
	p("==== gpuproxy attack: %s size, %d replicas, binary %s", r.mode, r.replicas, r.bin)
	p("wall time %s (attack %s, lifetime wait %s, settle %s)", r.wall.Round(time.Millisecond), r.attackTime.Round(time.Millisecond),
		r.lifetimeWait.Round(time.Millisecond), r.settleTime.Round(time.Millisecond))
	p("chaos: %s", strings.Join(r.chaos, "; "))
	p("")
	p("creates (%s, limits %v, the first raised by $%g a wave to %v): %d sent", createAccount, limits[createAccount],
		raises[createAccount], raised(limits[createAccount], raises[createAccount], r.waves-1)[0], len(r.creates))
	p("  outcomes: %s", r.createOut.String())
	retried := 0
	for _, c := range r.creates {
		if c.attempts > 1 {
			retried++
		}
	}
	p("  %d creates were sent again with their Idempotency-Key after a transport error or 5xx", retried)
	var provs []string
	for k := range r.admittedUSD {
		provs = append(provs, k)
	}
	sort.Strings(provs)
	total := 0.0
	for _, k := range provs {
		p("  admitted %-8s %3d creates, asking $%.6f (vast.ai: price x 1h; io.net: prepaid total)", k, r.admittedN[k], r.admittedUSD[k])
		total += r.admittedUSD[k]
	}
	p("  admitted in all $%.6f (destroys and refunds in between free room for more)", total)
	p("destroys: %s", r.destroys.String())
	if s := r.final2; s != nil {
		if a := s.byName[createAccount]; a != nil {
			var pre, ref, met, other int64
			for _, e := range s.ledger {
				if e.account != a.id {
					continue
				}
				switch {
				case e.typ == "charge" && e.basis == "prepaid":
					pre += e.spend
				case e.typ == "refund":
					ref += e.spend
				case strings.HasPrefix(e.key, "meter:"):
					met += e.spend
				default:
					other += e.spend
				}
			}
			p("  ledger: io.net prepaid %s, refunds %s, metered %s, other %s", usd(pre), usd(ref), usd(met), usd(other))
			states := map[string]int{}
			for _, in := range s.instances {
				if in.account == a.id {
					states[in.provider+" "+in.status]++
				}
			}
			p("  instance rows: %s", fmtCounts(states))
		}
	}
	p("")
	if r.spec != nil && r.specFigures != nil {
		r.spec.report(p, r.specFigures, r.waves)
		p("")
	}
	if r.idle != nil && r.lifetime != nil {
		r.lifetime.report(p, r.sz, r.idle, r.idle.watch)
		p("")
	}
	if r.svc != nil && r.svcFigures != nil {
		r.svcFigures.report(p, r.svc)
		p("")
	}
	if r.partFigures != nil {
		r.partFigures.report(p, r.partProc)
	}
	if r.tok != nil && r.tokFigures != nil {
		r.tokFigures.report(p, r.tok, r.waves)
		p("")
	}
	p("proxy (%s, limits %v raised by $%g a wave to %s, $%g per request): %d sent", proxyAccount, limits[proxyAccount],
		raises[proxyAccount], usd(r.proxyLimit), requestCost, r.proxyTotal())
	p("  outcomes: %s", r.proxy.String())
	room := r.proxyLimit - r.proxyPrior
	p("  prior spend %s, room %s = %d requests; served (2xx) %d = %s; charged %s", usd(r.proxyPrior), usd(room),
		room/int64(requestCost*1e6), r.proxyServed, usd(int64(r.proxyServed)*int64(requestCost*1e6)), usd(r.proxyCharged))
	p("  served by process: %s; by SIGKILLed processes %v: %d (a killed replica's unsettled lease is released at expiry: those calls go uncharged)", r.proxyByProc.String(),
		r.killedProcs, r.proxyByKilled)
	p("")
	keysReport(p, r.keys, r.hasKeys, r.keyProxies, r.waves)
	p("")
	p("windows at the end (spent counts every row dated after the window's start, also later than now; a key's, every row attributed to it):")
	for _, w := range r.final {
		p("  %s", w)
	}
	p("worst sampled while running (%d samples, %d failed while the database was down):", r.samples, r.sampleErrs)
	keys := make([]string, 0, len(r.peak))
	for k := range r.peak {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		pk, c := r.peak[k], r.confirmed[k]
		p("  %s", pk)
		if excess(c) > -1<<39 {
			p("  %-18s %5dm  confirmed by two consecutive samples: overspend %s", c.scope(), c.minutes, usd(max(0, excess(c))))
		}
	}
	p("")
	p("provider instances: %d listed, %d live; open proxy leases while replicas ran: %d", r.providerAll, r.providerLive, r.leasesLive)
	if len(r.violations) == 0 {
		p("invariants: all hold")
	} else {
		p("invariants: %d BROKEN", len(r.violations))
		for i, v := range r.violations {
			if i == 60 {
				p("  … and %d more", len(r.violations)-i)
				break
			}
			p("  - %s", v)
		}
	}
	return b.String()
}

func (r *report) proxyTotal() int {
	r.proxy.mu.Lock()
	defer r.proxy.mu.Unlock()
	n := 0
	for _, c := range r.proxy.m {
		n += c
	}
	return n
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
