package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// Lifetimes (issue 21): instances with the shortest idle timeout gpuproxy
// takes (10 s) and no grace, some to be stopped (vast.ai keeps the disk),
// some destroyed (vast.ai, io.net, and io.net asked to stop, which it
// cannot), one by spec, created through the replicas while a replica is
// SIGKILLed and Postgres restarts. Some get proxied traffic for a while
// first, over every replica (a killed one's last activity may be lost),
// then go idle. Each must be acted on once, by its rule, never while its
// traffic flowed, and within a few decision intervals of its deadline
// (lifetimecheck_test.go).

// idleAccount owns the lifetime instances, under a window far above what
// they cost (no refusal, no kill switch: only their rule acts on them).
const idleAccount = "atk-idle"

var idleLimits = []keyWindow{{60, 50}}

// The lifetime settings of the attack and the slack the checks allow.
const (
	idleTimeout = 10 * time.Second // the shortest idle_timeout gpuproxy takes
	// lifetimeInterval is the replicas' GPUPROXY_LIFETIME_INTERVAL (how
	// often the deciding replica applies the rules).
	lifetimeInterval = time.Second
	// activityFlush is the replicas' default proxy activity flush: how
	// often each reports the activity it proxied to the store.
	activityFlush = 2 * time.Second
	trafficGap    = 250 * time.Millisecond // between one instance's proxied requests
	// idleEarly is how much sooner than its last served request plus the
	// idle timeout an instance may be acted on: the activity a replica
	// has not yet flushed (or a killed replica lost), and the gap to the
	// request before.
	idleEarly = activityFlush + 2*trafficGap + 500*time.Millisecond
	// idleLate is how much later than its deadline an instance may be
	// acted on: a few decision intervals (a killed leader's lock passes
	// on, a database restart).
	idleLate = 3*lifetimeInterval + time.Second
	// stopLag bounds the time from a decision to the end of the meter
	// (the provider call in between).
	stopLag = 5 * time.Second
	// idleOfferTries is how many offers a by-offer lifetime create tries
	// (the other creates and the churn take some first).
	idleOfferTries = 8
	// idleMaxPrice bounds the offers lifetime instances rent by offer id
	// (USD per hour): above the other creates' $1, so they meet fewer
	// offers the herd just took.
	idleMaxPrice = 2.0
)

// idleKind is one kind of lifetime instance.
type idleKind struct {
	provider string
	ask      string // the idle_action asked for
	want     string // what must happen: "stop" (vast.ai) or "destroy"
	spec     bool   // rented by spec, not by offer id
	traffic  bool   // proxied to for a while before going idle
}

func (k idleKind) String() string {
	s := k.provider + " " + k.ask
	if k.ask != k.want {
		s += "→" + k.want
	}
	if k.spec {
		s += " by spec"
	}
	if k.traffic {
		s += " +traffic"
	}
	return s
}

var (
	trafficKinds = []idleKind{
		{provider: "vast.ai", ask: "stop", want: "stop", traffic: true},
		{provider: "vast.ai", ask: "destroy", want: "destroy", traffic: true},
		{provider: "io.net", ask: "destroy", want: "destroy", traffic: true},
	}
	quietKinds = []idleKind{
		{provider: "vast.ai", ask: "stop", want: "stop"},
		{provider: "vast.ai", ask: "destroy", want: "destroy"},
		{provider: "vast.ai", ask: "stop", want: "stop", spec: true},
		{provider: "io.net", ask: "stop", want: "destroy"}, // io.net cannot stop: idle means destroyed
	}
)

// idleKindsAt are the lifetime instances created in a wave: size.idle
// names "traffic", "quiet" or "all" of the kinds per wave.
func (sz size) idleKindsAt(wave int) []idleKind {
	switch sz.idle[wave] {
	case "traffic":
		return trafficKinds
	case "quiet":
		return quietKinds
	case "all":
		return append(append([]idleKind(nil), trafficKinds...), quietKinds...)
	}
	return nil
}

// idleInst is one lifetime instance as the harness saw it.
type idleInst struct {
	n     int
	kind  idleKind
	wave  int
	idem  string
	final reply // the create's final answer
	tries int   // offers (by offer id) or sends (by spec)
	id    string
	// runningAt is when a GET first showed it running (zero: never).
	runningAt time.Time
	// The traffic: requests sent and served (2xx), when the first was
	// sent and the last served answered, and every outcome.
	sent, served            int
	firstServed, lastServed time.Time
	out                     tally
}

// idleLoad is the lifetime instances of the run.
type idleLoad struct {
	key         string // the idle account's key
	trafficFor  time.Duration
	vast, ionet []offer
	watch       *actWatch

	mu    sync.Mutex
	insts []*idleInst
	wg    sync.WaitGroup
}

// start creates, in the background, the wave's lifetime instances once
// gate opens (with the wave's burst), and proxies to those with traffic.
func (il *idleLoad) start(ctx context.Context, a *api, sz size, wave int, gate <-chan struct{}) {
	for i, k := range sz.idleKindsAt(wave) {
		in := &idleInst{n: wave*100 + i, kind: k, wave: wave, idem: fmt.Sprintf("idle-%d-%d", wave, i)}
		il.mu.Lock()
		il.insts = append(il.insts, in)
		il.mu.Unlock()
		il.wg.Go(func() {
			<-gate
			il.run(ctx, a, in)
		})
	}
}

// lifetimeBody is the lifetime part of a create.
func lifetimeBody(k idleKind) map[string]any {
	return map[string]any{"idle_timeout": idleTimeout.String(), "idle_grace": "0s", "idle_action": k.ask}
}

func (il *idleLoad) run(ctx context.Context, a *api, in *idleInst) {
	if in.kind.spec {
		il.createBySpec(ctx, a, in)
	} else {
		il.createByOffer(ctx, a, in)
	}
	if in.id == "" {
		return
	}
	// The client looks at its instance every 100 ms, each look a request
	// on a replica (in turn): part of the load.
	i, ended := 0, false
	testpoll.WaitEvery(30*time.Second, 100*time.Millisecond, func() bool {
		inst, _ := a.get(ctx, in.n+i, il.key, in.id)
		i++
		switch inst.Status {
		case "running":
			in.runningAt = time.Now()
		case "failed", "terminated", "stopped":
			ended = true
		}
		return !in.runningAt.IsZero() || ended || ctx.Err() != nil
	})
	if ended || !in.kind.traffic || in.runningAt.IsZero() {
		return
	}
	for i, end := 0, in.runningAt.Add(il.trafficFor); time.Now().Before(end) && ctx.Err() == nil; i++ {
		sent := time.Now()
		r := a.proxyCall(ctx, in.n+i, il.key, in.id, i)
		in.sent++
		in.out.add(outcome(r))
		if r.err == nil && r.status/100 == 2 {
			in.served++
			if in.firstServed.IsZero() {
				in.firstServed = sent
			}
			in.lastServed = time.Now()
		}
		// pace: the instance's traffic, a request every trafficGap.
		time.Sleep(trafficGap)
	}
}

// createByOffer rents one of the provider's live offers under idleMaxPrice with
// the lifetime rules, from a fresh search (vast.ai relists a machine
// under a new ask id once it is free again), trying another offer while
// one is gone (taken by the other creates, or by churn); each try has its
// own Idempotency-Key, sent again to the next replica while its outcome
// is unknown.
func (il *idleLoad) createByOffer(ctx context.Context, a *api, in *idleInst) {
	offers, hours := il.vast, 0
	if in.kind.provider == "io.net" {
		offers, hours = il.ionet, 2 // prepaid past the first hour: the destroy refunds
	}
	for try := range idleOfferTries {
		in.tries++
		if fresh, err := a.offersAt(ctx, in.n+try, il.key, idleMaxPrice); err == nil {
			if mine := providerOffers(fresh, in.kind.provider); len(mine) > 0 {
				offers = mine
			}
		}
		res := a.createWith(ctx, in.n+try, il.key, offers[rand.IntN(len(offers))], hours,
			fmt.Sprintf("%s-%d", in.idem, try), lifetimeBody(in.kind))
		in.final = res.final
		if res.inst.ID != "" {
			in.id = res.inst.ID
			return
		}
		if res.final.retryable() || ctx.Err() != nil {
			return // unknown outcome after every resend: not tracked
		}
	}
}

// providerOffers are the offers of one provider.
func providerOffers(os []offer, provider string) []offer {
	var out []offer
	for _, o := range os {
		if o.Provider == provider {
			out = append(out, o)
		}
	}
	return out
}

// createBySpec rents by spec (the by-spec load's, on vast.ai) with the
// lifetime rules, sent again to the next replica while the outcome is
// unknown or the call still runs elsewhere.
func (il *idleLoad) createBySpec(ctx context.Context, a *api, in *idleInst) {
	body := specBody()
	maps.Copy(body, lifetimeBody(in.kind))
	hdr := map[string]string{"Idempotency-Key": in.idem}
	for try := 0; try <= specResends && ctx.Err() == nil; try++ {
		in.tries++
		in.final = a.do(ctx, in.n+try, http.MethodPost, "/api/v1/gpu/instances", il.key, body, hdr)
		if specState(in.final) == "final" {
			var inst specInstance
			if rented(in.final.status) && json.Unmarshal(in.final.body, &inst) == nil {
				in.id = inst.ID
			}
			return
		}
		// pace: a client's resend backoff.
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	}
}

// created lists the lifetime instances that were rented.
func (il *idleLoad) created() []*idleInst {
	il.mu.Lock()
	defer il.mu.Unlock()
	var out []*idleInst
	for _, in := range il.insts {
		if in.id != "" {
			out = append(out, in)
		}
	}
	return out
}

// deadline is when every rented lifetime instance must have been acted
// on: its idle period's start (running, or the last served request) plus
// the idle timeout and idleLate, and a second more to see it.
func (il *idleLoad) deadline() time.Time {
	var d time.Time
	for _, in := range il.created() {
		base := in.runningAt
		if in.lastServed.After(base) {
			base = in.lastServed
		}
		if base.IsZero() {
			base = time.Now()
		}
		d = latest(d, base.Add(idleTimeout+idleLate+time.Second))
	}
	return d
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitActed waits, once their traffic has ended, until every rented
// lifetime instance has been stopped or destroyed (as the watcher sees
// the rows), or the deadline passes.
func (il *idleLoad) waitActed(ctx context.Context) {
	il.wg.Wait()
	deadline := il.deadline()
	ids := il.created()
	testpoll.Wait(time.Until(deadline), func() bool {
		for _, in := range ids {
			if st := il.watch.status(in.id); st != "stopped" && st != "terminated" && st != "failed" {
				return ctx.Err() != nil
			}
		}
		return true
	})
}

// scrapeActs sums gpuproxy_instances_stopped_total{rule="idle_timeout"}
// over the replicas' current processes (-1 when one cannot be read).
func scrapeActs(ctx context.Context, a *api, replicas []*replica) float64 {
	var sum float64
	for i := range replicas {
		r := a.do(ctx, i, http.MethodGet, "/metrics", "", nil, nil)
		if r.err != nil || r.status != http.StatusOK {
			return -1
		}
		for _, line := range strings.Split(string(r.body), "\n") {
			if rest, ok := strings.CutPrefix(line, `gpuproxy_instances_stopped_total{rule="idle_timeout"} `); ok {
				var v float64
				if _, err := fmt.Sscan(rest, &v); err == nil {
					sum += v
				}
			}
		}
	}
	return sum
}

// setUpIdleAccount creates the idle account, its window, credit and key
// through the CLI, and returns the key.
func setUpIdleAccount(run func(args ...string) string) string {
	run("accounts", "create", idleAccount)
	args := []string{"limits", "set", "--account", idleAccount}
	for _, w := range idleLimits {
		args = append(args, "--window", w.String())
	}
	run(args...)
	run("credits", "add", "--account", idleAccount, "--amount", "1000")
	return lastLine(run("keys", "create", "--account", idleAccount, "--preset", "assistant", "--name", "attack idle"))
}
