package attack

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// size is one size of the attack.
type size struct {
	replicas       int
	waves          int
	createsPerWave int
	proxyPerWave   int
	specPerWave    int            // by-spec creates (issue 20)
	tokensPerWave  int            // token-priced requests (issue 23, tokens_test.go)
	preemptPerWave int            // interruptible creates by spec, preempted by the market (issue 33, preempt_test.go)
	chaos          map[int]string // wave → "kill" | "pg" | "kill0"
	budget         time.Duration  // deadline of the run after the build
	settle         time.Duration
	// idle names the lifetime instances created per wave (lifetime_test.go:
	// "traffic", "quiet" or "all" of the kinds); idleTraffic is how long
	// those with traffic are proxied to before they go idle.
	idle        map[int]string
	idleTraffic time.Duration
	// cutFor is how long the partition phase (partition_test.go) cuts
	// cutReplica off from Postgres: longer than the lease expiry plus two
	// reconciler rounds.
	cutFor time.Duration
}

var sizes = map[string]size{
	// ci: about 23 s on a 2-core machine, plus the build (up to 2 min with
	// a cold cache). Its lifetime instances with traffic start with the
	// attack, so that their traffic spans the SIGKILL and the database
	// restart and their idle deadlines fall with the others'; 4 s of
	// traffic is more than idleEarly, so an act that ignored it (at
	// running + idle timeout) is still caught.
	"ci": {replicas: 3, waves: 4, createsPerWave: 50, proxyPerWave: 100, specPerWave: 24, tokensPerWave: 40, preemptPerWave: 6,
		chaos: map[int]string{1: "kill", 2: "pg"}, budget: 2 * time.Minute, settle: 30 * time.Second,
		idle: map[int]string{0: "traffic", 1: "quiet", 2: "quiet"}, idleTraffic: 4 * time.Second, cutFor: 10 * time.Second},
	// full: traffic longer than the idle timeout, across later chaos.
	"full": {replicas: 4, waves: 8, createsPerWave: 50, proxyPerWave: 250, specPerWave: 30, tokensPerWave: 80, preemptPerWave: 10,
		chaos: map[int]string{2: "kill", 4: "pg", 6: "kill0"}, budget: 15 * time.Minute, settle: 60 * time.Second,
		idle: map[int]string{1: "traffic", 2: "all", 4: "all", 6: "quiet"}, idleTraffic: 15 * time.Second, cutFor: 14 * time.Second},
}

// The attack's settings: short intervals so the background loops run many
// times during the attack.
const (
	requestCost  = 0.01 // USD per proxied request
	leaseExpiry  = 5 * time.Second
	reconcileInt = time.Second
	meteringInt  = time.Second
	horizon      = time.Hour
	simStart     = time.Second // simulated instances run this long after create
)

// The accounts: creates against $5 per 60 min and $20 per 24 h, proxy
// bursts against $2 per 60 min after some spend, and by-spec creates
// (specAccount, spec_test.go) against $0.50 per 60 min and $4 per 24 h.
const (
	createAccount = "atk-create"
	proxyAccount  = "atk-proxy"
)

var accounts = []string{createAccount, proxyAccount, specAccount}

var limits = map[string][]keyWindow{
	createAccount: {{60, 5}, {1440, 20}},
	proxyAccount:  {{60, 2}},
	specAccount:   {{60, 0.5}, {1440, 4}},
}

// Before every wave after the first, each account's first window is raised
// by its raise, through the admin API, so that every burst (the chaos ones
// too) contests a limit that has room: the account's, and inside it the
// windows of the keys that have their own (which are raised too, or not).
var raises = map[string]float64{createAccount: 1.5, proxyAccount: 0.2, specAccount: 0.25}

// raised is windows in wave w: the first raised w times by raise, in whole
// micro-dollars.
func raised(ws []keyWindow, raise float64, wave int) []keyWindow {
	ws = append([]keyWindow(nil), ws...)
	if len(ws) > 0 {
		ws[0].usd = math.Round((ws[0].usd+raise*float64(wave))*1e6) / 1e6
	}
	return ws
}

func TestAttack(t *testing.T) {
	mode := os.Getenv("GPUPROXY_ATTACK")
	if mode == "" {
		t.Skip("the attack harness runs only with GPUPROXY_ATTACK=ci or full (scripts/attack)")
	}
	sz, ok := sizes[mode]
	if !ok {
		t.Fatalf("GPUPROXY_ATTACK=%q: want ci or full", mode)
	}
	began := time.Now()
	dir, err := os.MkdirTemp("", "gpuproxy-attack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("GPUPROXY_ATTACK_KEEP") != "" {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	bin := gpuproxyBinary(t, dir)
	// The budget starts after the build, which a cold cache makes slow.
	ctx, cancel := context.WithTimeout(context.Background(), sz.budget)
	defer cancel()
	simBin := bin
	if b := os.Getenv("GPUPROXY_SIM_BIN"); b != "" {
		simBin = b
	}

	pg := startCluster(t, "gpuproxy")
	dbURL := pg.url("gpuproxy")
	t.Logf("own Postgres cluster on 127.0.0.1:%d (%s), data in %s", pg.port, pg.bin, pg.dir)
	// The cut replica's path to it, through a network namespace of the
	// harness's own (partnet_test.go).
	var pnet *partitionNet
	if sz.cutFor > 0 {
		if pnet, err = setUpPartitionNet(pg.port); err != nil {
			t.Fatalf("the partition's path to Postgres: %v", err)
		}
		t.Cleanup(pnet.close)
		t.Logf("replica%d reaches Postgres through %s", cutReplica, pnet.describe())
	}

	// The preemption wave's market (preempt_test.go): a trace of
	// preemptions, nothing else moving.
	preemptFlags, err := preemptSimFlags(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, senv, simDropped, err := startSim(dir, simBin, simStart, offerChurn, preemptFlags...)
	if err != nil {
		t.Fatal(err)
	}
	churn := offerChurn
	if slices.Contains(simDropped, "--offer-churn") {
		churn = 0
		t.Logf("this sim build has no --offer-churn: offers are gone only when our own creates race for them")
	}
	t.Cleanup(func() { _ = sim.stop(syscall.SIGTERM, 10*time.Second) })

	// The replicas reach the simulators through relays that record the
	// calls changing an instance's state (relay_test.go).
	relays, renv, err := startRelays(senv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range relays {
			r.close()
		}
	})

	cfgPath := filepath.Join(dir, "gpuproxy.yaml")
	env := cleanEnv(append(append(renv, "DATABASE_URL="+replicaDBURL(dbURL),
		"GPUPROXY_LIFETIME_INTERVAL="+lifetimeInterval.String(),
		"GPUPROXY_PROXY_ALLOW_NETWORKS=127.0.0.0/8",
		fmt.Sprintf("GPUPROXY_PROXY_REQUEST_COST=%g", requestCost),
		"GPUPROXY_PROXY_LEASE_EXPIRY="+leaseExpiry.String(),
		"GPUPROXY_RATE_LIMIT=0"), svcEnv()...)...)
	keys, dropped, err := migrateWithConfig(ctx, bin, cfgPath, env, []cfgKey{
		{"", "metering_interval", meteringInt.String()},
		{"", "rate_limit_per_minute", "0"},
		{"", "horizon", horizon.String()},
		{"fleet", "poll_interval", "200ms"},
		{"fleet", "reconcile_interval", reconcileInt.String()},
		{"fleet", "pending_grace", "3s"},
		{"fleet", "offer_cache_ttl", "1s"},
		{"proxy", "request_cost", fmt.Sprint(requestCost)},
		{"proxy", "lease_expiry", leaseExpiry.String()},
		{"proxy", "allow_networks", "[127.0.0.0/8]"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) > 0 {
		t.Logf("config keys this build does not know (dropped; env vars still set): %v", dropped)
	}
	// Lease ages are judged only when the build takes the expiry we set.
	leaseAge, finalLeaseAge := leaseExpiry+2*reconcileInt+2*time.Second, time.Duration(0)
	if !slices.ContainsFunc(keys, func(k cfgKey) bool { return k.key == "lease_expiry" }) {
		leaseAge, finalLeaseAge = -1, -1
		t.Logf("this build has no proxy.lease_expiry: proxy lease ages are not checked")
	}

	// Accounts, keys, limits and credits, through the CLI.
	run := func(args ...string) string {
		t.Helper()
		out, err := cli(ctx, bin, env, append(args, "-c", cfgPath)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	st0, err := readState(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	hasKeys := st0.hasKeys
	if !hasKeys {
		t.Logf("this build has no per-key windows: keys are attacked without windows of their own, key windows not checked")
	}
	apiKeys, adminKeys := map[string]string{}, map[string]string{}
	for _, acct := range accounts {
		run("accounts", "create", acct)
		adminKeys[acct] = lastLine(run("keys", "create", "--account", acct, "--preset", "admin", "--name", "attack admin"))
		args := []string{"limits", "set", "--account", acct}
		for _, w := range limits[acct] {
			args = append(args, "--window", w.String())
		}
		run(args...)
		run("credits", "add", "--account", acct, "--amount", "1000")
	}
	ks := attackKeys()
	if err := setUpKeys(ctx, ks, run, dbURL, hasKeys); err != nil {
		t.Fatal(err)
	}
	for _, acct := range accounts {
		apiKeys[acct] = ks.plain(acct).secret
	}
	idleKey := ""
	if st0.hasLifetimes {
		idleKey = setUpIdleAccount(run)
	} else {
		t.Logf("this build has no instance lifetimes: lifetime instances left out")
	}
	var pl *preemptLoad
	if st0.hasMarket && !slices.Contains(simDropped, "--market-trace") && sz.preemptPerWave > 0 {
		pl = newPreemptLoad(setUpPreemptAccount(run))
	} else {
		t.Logf("this build has no markets, or its sim no market trace: the preemption wave left out")
		sz.preemptPerWave = 0
	}

	// The replicas, all on the one database.
	replicas := make([]*replica, sz.replicas)
	for i := range replicas {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = &replica{idx: i, port: port, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
		if pnet != nil && i == cutReplica {
			cutURL := strings.Replace(dbURL, fmt.Sprintf("127.0.0.1:%d", pg.port), pnet.host(), 1)
			replicas[i].env = []string{"DATABASE_URL=" + replicaDBURL(cutURL)}
		}
	}
	var wg sync.WaitGroup
	startErrs := make([]error, len(replicas))
	for i, r := range replicas {
		wg.Go(func() { startErrs[i] = r.start(dir, bin, cfgPath, env) })
	}
	wg.Wait()
	t.Cleanup(func() {
		// After a failure, SIGQUIT first: a Go process writes every
		// goroutine's stack to its log (kept), which shows a replica
		// that hung, and on what.
		sig := syscall.SIGKILL
		if t.Failed() {
			sig = syscall.SIGQUIT
		}
		for _, r := range replicas {
			if p := r.proc(); p != nil {
				_ = p.stop(sig, 5*time.Second)
			}
		}
	})
	for _, err := range startErrs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("setup done in %s: %d replicas, sim %s / %s", time.Since(began).Round(time.Millisecond), len(replicas),
		senv["VASTAI_BASE_URL"], senv["IONET_BASE_URL"])

	a := newAPI(replicas, sz.proxyPerWave+sz.createsPerWave+2*sz.specPerWave+sz.tokensPerWave)
	// Rent by spec, if the build has it: a spec under every offer names
	// the nearest miss and rents nothing.
	var spec *specLoad
	if ok, r, err := probeSpec(ctx, a, apiKeys[specAccount]); err != nil {
		t.Fatal(err)
	} else if ok {
		spec = &specLoad{churn: churn, probed: r}
	} else {
		t.Logf("this build has no rent by spec (%s): by-spec creates left out", r)
		ks, sz.specPerWave = ks.without(specAccount), 0
	}
	rep := &report{mode: mode, sz: sz, bin: bin, replicas: len(replicas), keys: ks, hasKeys: hasKeys, waves: sz.waves, spec: spec}

	// Offers, and the proxy account's running instance: io.net, prepaid
	// for one hour, so the account starts the burst with spend already and
	// no metered burn.
	allOffers, err := a.offers(ctx, apiKeys[createAccount], 1.0)
	if err != nil {
		t.Fatal(err)
	}
	var vast, ionet []offer
	for _, o := range allOffers {
		switch o.Provider {
		case "vast.ai":
			vast = append(vast, o)
		case "io.net":
			ionet = append(ionet, o)
		}
	}
	if len(vast) == 0 || len(ionet) == 0 {
		t.Fatalf("need offers of both providers under $1/h, got %d vast.ai and %d io.net", len(vast), len(ionet))
	}
	sort.Slice(ionet, func(i, j int) bool { return ionet[i].PricePerHour < ionet[j].PricePerHour })
	// The service (issue 22), if the build has services: created now, so
	// that the load scales it while the proxy instance starts, before the
	// waves' herd takes offers.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watchWG sync.WaitGroup
	var svc *serviceLoad
	if ok, r, err := probeServices(ctx, a, apiKeys[createAccount]); err != nil {
		t.Fatal(err)
	} else if ok {
		if svc, err = startService(ctx, wctx, a, run, dbURL, senv, allOffers, apiKeys[createAccount], &watchWG); err != nil {
			t.Fatal(err)
		}
		rep.svc = svc
	} else {
		t.Logf("this build has no services (%s): the services phase left out", r)
	}
	proxyInst := prepareProxyInstance(ctx, t, a, apiKeys[proxyAccount], ionet[0])
	// Token prices (issue 23), if the build gives accounts their own:
	// atk-tok's running vast.ai instance (its hour committed: the dearest
	// under $1, so that its hour is several times a request's reserved
	// cost and a lease that fills it shows), its price and its tight
	// window.
	dearVast := slices.Clone(vast)
	sort.Slice(dearVast, func(i, j int) bool { return dearVast[i].PricePerHour > dearVast[j].PricePerHour })
	tl, why, err := startTokens(ctx, t, a, run, dbURL, dearVast, tokProcs(sz))
	if err != nil {
		t.Fatal(err)
	}
	if tl == nil {
		t.Logf("this build has no account token prices (%s): the token phase left out", why)
		sz.tokensPerWave = 0
	}
	rep.tok = tl
	st, err := readState(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	rep.proxyPrior = st.accountSpend(proxyAccount)
	keyPriors := map[string]int64{}
	for _, k := range ks {
		keyPriors[k.id] = st.keySpend(k.id)
	}
	rep.proxyLimit = st.byName[proxyAccount].limits[0].limit
	var il *idleLoad
	if idleKey != "" {
		il = &idleLoad{key: idleKey, trafficFor: sz.idleTraffic, vast: vast, ionet: ionet, watch: &actWatch{}}
		rep.idle = il
		watchWG.Go(func() { il.watch.run(wctx, dbURL, idleAccount, 200*time.Millisecond) })
	}
	if pl != nil {
		watchWG.Go(func() { pl.watch.run(wctx, dbURL) })
		if err := pl.startService(ctx, a); err != nil {
			t.Fatal(err)
		}
		if pl.svcWhy != "" {
			t.Logf("%s: the preemption wave runs without a service", pl.svcWhy)
		}
	}
	t.Logf("proxy account: instance %s running at %s, prior spend %s, limit %s, so room for %d requests at $%g (raised by $%g a wave)",
		proxyInst.ID, proxyInst.Endpoint, usd(rep.proxyPrior), usd(rep.proxyLimit),
		(rep.proxyLimit-rep.proxyPrior)/int64(requestCost*1e6), requestCost, raises[proxyAccount])

	if svc != nil {
		svc.waitRamp(ctx)
		t.Logf("service %s: %d live replicas and %d refusals by the window %s after it was created", svc.id,
			svc.watch.maxLive(), svc.watch.windowBlocked(), svc.ramp.Round(time.Millisecond))
	}

	// The attack: waves of concurrent creates and proxy bursts across the
	// replicas, destroys in between, metering and reconciling all along,
	// and chaos mid-burst.
	samp := &sampler{}
	sctx, stopSampler := context.WithCancel(ctx)
	var sampWG sync.WaitGroup
	sampWG.Go(func() { samp.run(sctx, dbURL, 50*time.Millisecond, horizon, hasKeys) })

	type destroyReq struct{ id, key string } // by the key that created it
	destroyCh := make(chan destroyReq, sz.waves*(sz.createsPerWave+sz.specPerWave))
	var destroyWG sync.WaitGroup
	for w := range 4 {
		destroyWG.Go(func() {
			for d := range destroyCh {
				// Soon, but not at once: an overspend lasts long enough
				// for the sampler to see it before a refund hides it.
				// pace: holds the instance a while, as a user would.
				time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
				r := a.destroy(ctx, w, d.key, d.id)
				rep.destroys.add(outcome(r))
			}
		})
	}
	var chaosWG sync.WaitGroup
	attackStart := time.Now()
	for wave := range sz.waves {
		if ctx.Err() != nil {
			t.Fatalf("out of time before wave %d (a replica that hung shows what it waits on in the goroutine dump SIGQUIT writes to its log)", wave)
		}
		var prog progress
		total := int64(sz.createsPerWave + sz.proxyPerWave + sz.specPerWave + sz.tokensPerWave + sz.preemptPerWave)
		if action, ok := sz.chaos[wave]; ok {
			chaosWG.Go(func() {
				prog.waitFor(ctx, total/6) // mid-burst: a sixth of the wave has finished
				rep.addChaos(strikeChaos(ctx, t, action, wave, replicas, pg, dir, bin, cfgPath, env))
			})
		}
		if wave > 0 {
			// New room for this wave's burst, so every wave (the chaos
			// ones too) spends up to a limit under contention.
			for _, acct := range accounts {
				ws := raised(limits[acct], raises[acct], wave)
				r := putLimits(ctx, a, wave, "/api/v1/accounts/"+acct+"/limits", adminKeys[acct], ws)
				if r.err != nil || r.status != http.StatusOK {
					t.Fatalf("raising %s's windows to %v: %s", acct, ws, r)
				}
			}
			if tl != nil {
				if err := tl.setWindow(ctx, a, wave); err != nil {
					t.Fatal(err)
				}
			}
			// And some keys' own windows inside them.
			for _, k := range ks {
				if k.raise == 0 || !hasKeys {
					continue
				}
				ws := k.windowsAt(wave)
				if r := putLimits(ctx, a, wave, "/api/v1/keys/"+k.id+"/limits", adminKeys[k.account], ws); r.err != nil || r.status != http.StatusOK {
					t.Fatalf("raising key %s's windows to %v: %s", k.name, ws, r)
				}
			}
		}
		gate := make(chan struct{})
		var waveWG sync.WaitGroup
		for i := range sz.createsPerWave {
			n := wave*sz.createsPerWave + i
			waveWG.Go(func() {
				<-gate
				o, hours := vast[rand.IntN(len(vast))], 0
				if n%10 < 7 { // seven in ten on io.net, prepaid for 1-3 hours
					o, hours = ionet[rand.IntN(len(ionet))], 1+rand.IntN(3)
				}
				k := ks.pick(createAccount, n)
				res := a.create(ctx, n, k.secret, o, hours, fmt.Sprintf("atk-%d", n))
				prog.done.Add(1)
				rep.addCreate(res)
				k.addCreate(res)
				if res.inst.ID != "" && rand.IntN(100) < 60 { // destroyed early: io.net refunds, room for more
					destroyCh <- destroyReq{res.inst.ID, k.secret}
				}
			})
		}
		for i := range sz.specPerWave {
			n := wave*sz.specPerWave + i
			waveWG.Go(func() {
				<-gate
				k := ks.pick(specAccount, n)
				c := spec.call(ctx, a, n, k)
				prog.done.Add(1)
				if c.inst.ID != "" && rand.IntN(100) < specDestroyPct { // its machine back on the market
					destroyCh <- destroyReq{c.inst.ID, k.secret}
				}
			})
		}
		for i := range sz.proxyPerWave {
			n := wave*sz.proxyPerWave + i
			waveWG.Go(func() {
				<-gate
				k := ks.pick(proxyAccount, n/2) // n/2: each key sends both kinds of call
				r := a.proxyCall(ctx, n, k.secret, proxyInst.ID, n)
				prog.done.Add(1)
				rep.proxy.add(outcome(r))
				k.record(r)
				if r.err == nil && r.status/100 == 2 {
					rep.proxyByProc.add(r.proc)
					k.served.add(r.proc)
				}
			})
		}
		if il != nil {
			il.start(ctx, a, sz, wave, gate)
		}
		if tl != nil {
			tl.start(ctx, a, wave, sz.tokensPerWave, gate, &waveWG, &prog)
		}
		if pl != nil {
			pl.start(ctx, a, wave, sz.preemptPerWave, gate, &waveWG, &prog)
		}
		close(gate)
		waveWG.Wait()
		// pace: a gap between waves for destroys, metering and reconciling.
		time.Sleep(200 * time.Millisecond)
	}
	chaosWG.Wait()
	if svc != nil {
		svc.stopLoad()
	}
	close(destroyCh)
	destroyWG.Wait()
	rep.attackTime = time.Since(attackStart)
	// Lifetimes: their traffic ends, then each idle instance is acted on.
	if il != nil {
		lifeStart := time.Now()
		il.waitActed(ctx)
		rep.lifetimeWait = time.Since(lifeStart)
	}

	// The partition: token-priced calls flow while cutReplica's packets
	// to Postgres are dropped for longer than a lease's expiry.
	var cut chaosMark
	cutProc, cutKey := "", ""
	if pnet != nil && tl != nil {
		r := replicas[cutReplica]
		gen := r.generation()
		cutProc, cutKey = fmt.Sprintf("%s#%d", r.name(), gen), tl.keyFor(r, gen).id
		pl := &partitionLoad{net: pnet, cutFor: sz.cutFor}
		if cut, err = pl.run(ctx, a, tl, sz.waves, sz.waves*sz.tokensPerWave); err != nil {
			t.Fatalf("partition: %v", err)
		}
		rep.addChaos(fmt.Sprintf("partition: %s cut from Postgres for %s (%s), calls flowing", cutProc,
			cut.to.Sub(cut.from).Round(time.Millisecond), pnet.mode), cut)
	} else if pnet != nil {
		t.Logf("no token phase: the partition phase left out")
	}

	// The preemption wave's kept instances, preempted and resumed all
	// along, are destroyed now.
	if pl != nil {
		pl.finish(ctx, a)
	}

	// Settle: nothing in flight, expired leases released, meters charged.
	settleStart := time.Now()
	// A killed replica's leases are released only by the reconciler, once
	// older than the expiry: wait for that before the others shut down.
	var notBefore time.Time
	if leaseAge >= 0 {
		for _, r := range replicas {
			r.mu.Lock()
			if t := r.lastKill.Add(leaseExpiry + 2*reconcileInt + 500*time.Millisecond); t.After(notBefore) {
				notBefore = t
			}
			r.mu.Unlock()
		}
	}
	settled := waitSettled(ctx, dbURL, sz.settle, leaseAge, notBefore)
	rep.settleTime = time.Since(settleStart)
	stopSampler()
	sampWG.Wait()
	var v violations
	if !settled {
		v.add("did not settle within %s (instances in flight, stopped meters not charged, or expired leases open)", sz.settle)
	}

	// Holds while the replicas live: leases only as old as the expiry
	// allows.
	if st, err := readState(ctx, dbURL); err != nil {
		t.Fatal(err)
	} else {
		rep.leasesLive = st.checkHolds(&v, leaseAge)
	}

	metric := scrapeActs(ctx, a, replicas)
	stopWatch()
	watchWG.Wait()

	// Stop every replica gracefully: they settle their leases on the way out.
	for _, r := range replicas {
		wg.Go(func() {
			if err := r.proc().stop(syscall.SIGTERM, 25*time.Second); err != nil {
				v.add("%s did not shut down cleanly: %v", r.name(), err)
			}
		})
	}
	wg.Wait()

	final, err := readState(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	rep.final = final.checkWindows(&v, horizon)
	final.checkLedger(&v)
	final.checkSettled(&v)
	final.checkHolds(&v, finalLeaseAge)
	final.checkCreates(&v, createAccount, rep.creates)
	var pis []providerInstance
	for _, list := range []func(context.Context, simEnv) ([]providerInstance, error){listVastAI, listIONet} {
		got, err := list(ctx, senv)
		if err != nil {
			t.Fatalf("listing provider instances: %v", err)
		}
		pis = append(pis, got...)
	}
	rep.providerLive = final.checkProviders(&v, pis)
	rep.providerAll = len(pis)
	if spec != nil {
		rep.specFigures = spec.check(&v, final, pis)
	}
	if il != nil {
		rep.lifetime = lifetimeRun{insts: il.insts, s: final, pis: pis, calls: recordedCalls(relays),
			seen: il.watch.histories(), chaos: rep.marks, logActs: loggedActs(dir), metric: metric}.check(&v)
	}
	if svc != nil {
		rows, err := readServiceRows(ctx, dbURL, svc.id)
		if err != nil {
			t.Fatal(err)
		}
		samples, errs := svc.watch.all()
		rep.svcFigures = serviceRun{id: svc.id, keyID: svc.svcKeyID, limit: svc.limit, s: final, rows: rows, pis: pis,
			samples: samples, sampleErrs: errs, reqs: svc.requests(), chaos: rep.marks, replicas: len(replicas)}.check(&v)
	}
	if pl != nil {
		pl.mu.Lock()
		pr := preemptRun{calls: slices.Clone(pl.calls), destroyed: maps.Clone(pl.destroyed), seen: pl.watch.histories(),
			s: final, pis: pis, svcID: pl.svcID, svcGone: pl.svcGone, svcDelete: pl.svcDeleted}
		pl.mu.Unlock()
		t.Log(pr.check(&v))
	}
	rep.peak, rep.confirmed, rep.samples, rep.sampleErrs = samp.worst()
	for _, c := range rep.confirmed {
		if excess(c) > 0 {
			v.add("overspend while running (two consecutive samples): %s %dm window: spent %s + held %s + committed %s - limit %s = %s beyond metered burn %s",
				c.scope(), c.minutes, usd(c.spent), usd(c.held), usd(c.commit), usd(c.limit), usd(c.over), usd(c.metered))
		}
	}
	// The proxy account: what was served and charged fits the room it had.
	// A SIGKILLed replica's served calls are never charged (its lease is
	// released at expiry, by design), so that room is given out again:
	// the calls of the processes that were not killed must fit the room,
	// and be charged in full.
	rep.proxyLimit = final.byName[proxyAccount].limits[0].limit
	room := rep.proxyLimit - rep.proxyPrior
	cost := int64(requestCost * 1e6)
	rep.proxyCharged = final.accountSpend(proxyAccount) - rep.proxyPrior
	rep.proxyServed = rep.proxy.served()
	for _, r := range replicas {
		rep.killedProcs = append(rep.killedProcs, r.killed...)
	}
	rep.proxyByKilled = 0
	for _, name := range rep.killedProcs {
		rep.proxyByKilled += rep.proxyByProc.get(name)
	}
	rep.proxyUnknown = rep.proxyByProc.get("")
	survivors := int64(rep.proxyServed - rep.proxyByKilled)
	if served := int64(rep.proxyServed) * cost; served > room && rep.proxyByKilled == 0 {
		v.add("proxy overspend: %d requests served at $%g = %s, room was limit %s - prior spend %s = %s",
			rep.proxyServed, requestCost, usd(served), usd(rep.proxyLimit), usd(rep.proxyPrior), usd(room))
	}
	if survivors*cost > room {
		v.add("proxy overspend: %d requests served by replica processes never killed, at $%g = %s > room %s (limit %s - prior spend %s)",
			survivors, requestCost, usd(survivors*cost), usd(room), usd(rep.proxyLimit), usd(rep.proxyPrior))
	}
	if rep.proxyCharged > room {
		v.add("proxy overspend: proxy charges %s > limit %s - prior spend %s = %s", usd(rep.proxyCharged),
			usd(rep.proxyLimit), usd(rep.proxyPrior), usd(room))
	}
	if unknown := int64(rep.proxyUnknown); rep.proxyCharged < (survivors-unknown)*cost {
		v.add("lost proxy charges: %d requests served by replica processes never killed, charged only %s (want at least %s)",
			survivors, usd(rep.proxyCharged), usd((survivors-unknown)*cost))
	}
	// Token prices: the window held, every record its counted tokens, the
	// ledger the records (but for what killed processes admitted).
	if tl != nil {
		recs, holds, err := readTokenRows(ctx, dbURL, tokAccount)
		if err != nil {
			t.Fatal(err)
		}
		tr := tokenRun{keys: tl.keyNames(), instID: tl.inst.ID, price: tl.price, reqs: tl.requests(), records: recs,
			holds: holds, killed: rep.killedProcs, chaos: rep.marks, replicas: len(replicas)}
		for _, w := range rep.final {
			if w.account == tokAccount && w.key == "" && w.minutes == 60 {
				tr.final = w
			}
		}
		if pk, ok := rep.peak[tokAccount+"/"+time.Hour.String()]; ok {
			tr.peak = &pk
		}
		if acct := final.byName[tokAccount]; acct != nil {
			for _, e := range final.ledger {
				if e.account == acct.id {
					tr.ledger = append(tr.ledger, e)
				}
			}
		}
		rep.tokFigures = tr.check(&v)
		dumpTokenRows(filepath.Join(dir, "tokens-ledger.txt"), tr)
		if cutProc != "" {
			pr := partitionRun{cut: cut, proc: cutProc, keyID: cutKey, wave: sz.waves, reqs: tr.reqs, holds: holds,
				ledger: tr.ledger, expiry: leaseExpiry, mode: pnet.mode, netDesc: pnet.describe()}
			rep.partFigures, rep.partProc = pr.check(&v), cutProc
		}
	}
	// The keys: attributed to their creator, refusals naming the right
	// window, every key's own windows contested, proxy keys within room.
	rep.keyProxies = checkKeys(&v, final, ks, keyPriors, rep.killedProcs)
	rep.final2 = final
	rep.wall = time.Since(began)
	rep.violations = v.list
	t.Log(rep.String())
	if len(v.list) > 0 {
		t.Errorf("%d invariant(s) broken; see the summary above (logs in %s)", len(v.list), dir)
	}
}
