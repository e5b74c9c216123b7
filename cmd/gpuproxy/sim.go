package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// simStartDelay is how long a simulated instance takes to start, unless
// told otherwise (serve --sandbox, gpuproxy sim).
const simStartDelay = 3 * time.Second

// simulators is both marketplace simulators serving on their own ports:
// what serve --sandbox runs in-process and gpuproxy sim serves for other
// processes. Their running instances serve simllm's OpenAI-compatible
// endpoint on 127.0.0.1, so they are reachable from any process on this
// machine.
type simulators struct {
	vast    *vastaisim.Server
	io      *ionetsim.Server
	vastURL string // base URL of the vast.ai API (VASTAI_BASE_URL)
	vastKey string // the key it accepts (VASTAI_API_KEY)
	ioURL   string // base URL of the io.net API (IONET_BASE_URL)
	ioKey   string // the key it accepts (IONET_API_KEY)
}

// simOptions configure startSimulators; zero values take the defaults.
type simOptions struct {
	vastAddr, ioAddr string        // listen addresses, default 127.0.0.1:0 (a free port)
	vastKey, ioKey   string        // accepted API keys, default random
	startDelay       time.Duration // default simStartDelay; negative: at once
	// vastChurn and ioChurn are the share (0..1) of the offers a search
	// lists that someone else rents before our create (the simulators'
	// OfferChurn); 0, the default, none.
	vastChurn, ioChurn float64
	// vastChurnAfter is how many vast.ai instances must be created before
	// its churn starts (vastaisim.Options.ChurnAfter).
	vastChurnAfter int
	// seed drives churn, the market and the capacity walk of both.
	seed int64
	// market, when set, makes vast.ai's market move (bids, preemption,
	// price walk, hosts, a refilling floor); nil keeps it fixed.
	market *vastaisim.Market
	// capacityWalk is io.net's per-location capacity walk
	// (ionetsim.Options.CapacityWalk); 0 keeps capacity fixed.
	capacityWalk float64
}

// sandboxMarket is the market serve --sandbox runs on vast.ai: bids are
// preempted and resume, prices walk, and two single-GPU offers of every
// model (and one of every GPU count) stay listed, so the README's
// examples never run the market dry.
// Hosts do not come and go (a listed offer a walkthrough picked stays);
// churn already takes offers away.
func sandboxMarket() *vastaisim.Market {
	m := vastaisim.DefaultMarket()
	m.HostRate = 0
	return &m
}

// simCapacityWalk is io.net's capacity walk when `gpuproxy sim --market`
// sets none: up to a tenth of a location's capacity moves per minute.
const simCapacityWalk = 0.1

// startSimulators starts both simulators. Close stops them.
func startSimulators(o simOptions) (*simulators, error) {
	if o.vastKey == "" {
		o.vastKey = randomHex(16)
	}
	if o.ioKey == "" {
		o.ioKey = randomHex(16)
	}
	vastDelay, ioDelay := o.startDelay, o.startDelay
	switch {
	case o.startDelay == 0:
		vastDelay, ioDelay = simStartDelay, simStartDelay
	case o.startDelay < 0:
		// vastaisim: negative is "at once"; ionetsim takes 0 as its
		// default, so the shortest positive delay instead.
		vastDelay, ioDelay = -1, time.Nanosecond
	}
	vo := vastaisim.Options{APIKey: o.vastKey, StartDelay: vastDelay,
		OfferChurn: o.vastChurn, ChurnAfter: o.vastChurnAfter, Seed: o.seed, Market: o.market}
	iono := ionetsim.Options{APIKey: o.ioKey, StartDelay: ioDelay, OfferChurn: o.ioChurn, Seed: o.seed,
		CapacityWalk: o.capacityWalk}
	if err := vo.Validate(); err != nil {
		return nil, err
	}
	if err := iono.Validate(); err != nil {
		return nil, err
	}
	s := &simulators{vast: vastaisim.New(vo), io: ionetsim.New(iono), vastKey: o.vastKey, ioKey: o.ioKey}
	var err error
	if s.vastURL, err = s.vast.Start(o.vastAddr); err != nil {
		return nil, fmt.Errorf("starting vast.ai simulator: %w", err)
	}
	if s.ioURL, err = s.io.Start(o.ioAddr); err != nil {
		s.vast.Close()
		return nil, fmt.Errorf("starting io.net simulator: %w", err)
	}
	s.vastURL, s.ioURL = dialableURL(s.vastURL), dialableURL(s.ioURL)
	return s, nil
}

// dialableURL replaces an unspecified listen address (0.0.0.0, [::]) in a
// base URL with 127.0.0.1, so that the printed URL can be used as is.
func dialableURL(u string) string {
	hostport := strings.TrimPrefix(u, "http://")
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil || !ap.Addr().IsUnspecified() {
		return u
	}
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ap.Port())))
}

// envLines is the environment that points serve at the simulators, one
// NAME=value line each.
func (s *simulators) envLines() string {
	return "VASTAI_BASE_URL=" + s.vastURL + "\nVASTAI_API_KEY=" + s.vastKey +
		"\nIONET_BASE_URL=" + s.ioURL + "\nIONET_API_KEY=" + s.ioKey + "\n"
}

// Close stops both simulators and their instances' inference servers.
func (s *simulators) Close() {
	s.vast.Close()
	s.io.Close()
}

// cmdSim serves both simulators until ctx ends (SIGINT/SIGTERM). Before
// serving, it prints exactly the four lines of envLines on stdout and
// then closes stdout when it can (so `eval "$(gpuproxy sim &)"` returns);
// logs go to stderr.
func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("sim")
	listen := f.String("listen", "127.0.0.1:0",
		"vast.ai on HOST:PORT and io.net on HOST:PORT+1 (PORT 0: a free port each)")
	vastKey := f.String("vastai-key", "", "API key the vast.ai simulator accepts (default random)")
	ioKey := f.String("ionet-key", "", "API key the io.net simulator accepts (default random)")
	delay := f.Duration("start-delay", simStartDelay, "how long a new instance takes to start running (0: at once)")
	envFile := f.String("env-file", "", "also write the four NAME=value lines to this file (mode 0600) before serving")
	churn := f.Float64("offer-churn", 0,
		"share (0 to 1) of the offers each search lists that someone else rents before your create, on both simulators; "+
			"a create on one gets the provider's offer-gone answer (0: none; serve --sandbox uses "+
			strconv.FormatFloat(sandboxOfferChurn, 'g', -1, 64)+" on vast.ai)")
	seed := f.Int64("seed", 0, "seed of offer churn, the market and io.net's capacity walk: equal seeds, equal markets")
	dm := vastaisim.DefaultMarket()
	market := f.Bool("market", false,
		"make the market move: vast.ai bids preempted and resumed, prices on a bounded walk, hosts leaving and arriving, "+
			"single-GPU offers refilled; io.net capacity moving per location (any flag below turns it on too)")
	hazard := f.Float64("preempt-hazard", dm.Hazard, "vast.ai: outranking rentals per hour per interruptible instance")
	hold := f.Duration("preempt-hold", dm.Hold, "vast.ai: mean time an outranking rental keeps the GPUs")
	walk := f.Float64("price-walk", dm.Walk, "vast.ai: largest relative price step per tick (0: prices fixed)")
	bound := f.Float64("price-bound", dm.WalkBound, "vast.ai: prices stay within list × (1 ± this)")
	hosts := f.Float64("host-rate", dm.HostRate, "vast.ai: hosts leaving, and arriving, per hour")
	singles := f.Int("min-singles", dm.MinSingles, "vast.ai: single-GPU offers of every model kept listed")
	perSize := f.Int("min-per-size", dm.MinPerSize, "vast.ai: offers of every GPU count (1, 2, 4, 8) kept listed")
	tick := f.Duration("market-tick", dm.Tick, "the market's step")
	trace := f.String("market-trace", "", "vast.ai: a trace file of market events (JSON lines: at, kind, gpu, value)")
	capWalk := f.Float64("capacity-walk", simCapacityWalk,
		"io.net: share of a location's capacity that may change per tick (0: fixed)")
	if err := f.parse(args); err != nil {
		return err
	}
	if len(f.args) > 0 {
		return fmt.Errorf("sim: unexpected argument %q", f.args[0])
	}
	f.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "preempt-hazard", "preempt-hold", "price-walk", "price-bound", "host-rate", "min-singles",
			"min-per-size", "market-tick", "market-trace", "capacity-walk":
			*market = true
		}
	})
	host, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("sim: --listen: %w", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65534 {
		return fmt.Errorf("sim: --listen: port must be 0 or between 1 and 65534 (io.net takes PORT+1)")
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if math.IsNaN(*churn) || *churn < 0 || *churn > 1 {
		return fmt.Errorf("sim: --offer-churn must be between 0 and 1, got %v", *churn)
	}
	o := simOptions{vastAddr: net.JoinHostPort(host, "0"), ioAddr: net.JoinHostPort(host, "0"),
		vastKey: *vastKey, ioKey: *ioKey, startDelay: *delay, vastChurn: *churn, ioChurn: *churn, seed: *seed}
	if *market {
		m := vastaisim.Market{Tick: *tick, Hazard: *hazard, Hold: *hold, OnDemandShare: dm.OnDemandShare,
			Walk: *walk, WalkBound: *bound, HostRate: *hosts, MinSingles: *singles, MinPerSize: *perSize}
		if *trace != "" {
			file, err := os.Open(*trace)
			if err != nil {
				return fmt.Errorf("sim: --market-trace: %w", err)
			}
			m.Trace, err = vastaisim.ParseTrace(file)
			file.Close()
			if err != nil {
				return fmt.Errorf("sim: --market-trace %s: %w", *trace, err)
			}
		}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		o.market, o.capacityWalk = &m, *capWalk
	}
	if port != 0 {
		o.vastAddr, o.ioAddr = net.JoinHostPort(host, strconv.Itoa(port)), net.JoinHostPort(host, strconv.Itoa(port+1))
	}
	if *delay == 0 {
		o.startDelay = -1
	} else if *delay < 0 {
		return fmt.Errorf("sim: --start-delay must not be negative")
	}
	log := newLogger(stderr, "info")
	sims, err := startSimulators(o)
	if err != nil {
		return err
	}
	defer sims.Close()
	lines := sims.envLines()
	if *envFile != "" {
		if err := writeEnvFile(*envFile, lines); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(stdout, lines); err != nil {
		return fmt.Errorf("writing to stdout: %w", err)
	}
	if c, ok := stdout.(io.Closer); ok {
		_ = c.Close()
	}
	log.Info("marketplace simulators serving", "vastai", sims.vastURL, "ionet", sims.ioURL,
		"start_delay", max(*delay, 0).String(), "offer_churn", *churn, "market", *market, "seed", *seed,
		"pid", os.Getpid())
	<-ctx.Done()
	log.Info("simulators stopped")
	return nil
}

// writeEnvFile writes content to path through a temporary file and a
// rename, so that a reader never sees it half written.
func writeEnvFile(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".gpuproxy-sim-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
