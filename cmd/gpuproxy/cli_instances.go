package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/fleet"
)

// DefaultServerURL is the gpuproxy that CLI commands call unless --url,
// GPUPROXY_URL or a running sandbox says otherwise: serve's default
// address.
const DefaultServerURL = "http://127.0.0.1:8080"

// instancesTimeout bounds one create call: a rent by spec may try several
// offers, each a live quote and a provider create.
const instancesTimeout = 5 * time.Minute

// instancesUsage is the overview's entries for `instances`.
const instancesUsage = `  instances create --image IMAGE (--provider P --offer ID | --max-price USD [--gpu NAME]… [spec flags])
                   [--max-duration 8h] [--idle-timeout 30m] [--idle-action stop|destroy] [--idle-grace 10m]
                   [--spend-cap USD]
                                              rent through the running server as GPUPROXY_API_KEY (--url,
                                              GPUPROXY_URL; default ` + DefaultServerURL + `): one offer, or by
                                              spec the cheapest live offer matching it, failing over; prints
                                              the offers tried (provider, offer, price, outcome, time) and
                                              the lifetime rules (default: the account's idle timeout)
  instances update ID [--max-duration D] [--idle-timeout D] [--idle-action stop|destroy] [--idle-grace D]
                   [--spend-cap USD]
                                              change a live instance's lifetime rules, within the account's
                                              policy; prints them and the rule that acts next
  instances keepalive ID                      count now as activity on a running instance: its idle
                                              timeout starts over`

// specFlagOf names the CLI flag of each field the API may name in an
// error about a create.
var specFlagOf = map[string]string{
	"provider": "--provider", "offer_id": "--offer", "image": "--image", "label": "--label", "hours": "--hours",
	"env": "--env", "ports": "--port", "idempotency_key": "--idempotency-key", "confirm_token": "--confirm-token",
	"image_login": "--image-login", "onstart": "--onstart", "args": "--arg",
	"spec.gpu": "--gpu", "spec.min_vram_gb": "--min-vram", "spec.num_gpus": "--gpus",
	"spec.max_price_per_hour": "--max-price", "spec.providers": "--providers",
	"spec.min_reliability": "--min-reliability", "spec.locations": "--location", "spec.billing": "--billing",
	"spec.hours": "--hours", "spec.max_attempts": "--max-attempts",
	"max_duration": "--max-duration", "idle_timeout": "--idle-timeout", "idle_action": "--idle-action",
	"idle_grace": "--idle-grace", "spend_cap": "--spend-cap",
}

// specFlags are the flags that describe a spec (all but --hours, which
// both forms take).
var specFlags = []string{"gpu", "min-vram", "gpus", "max-price", "providers", "min-reliability", "location",
	"billing", "max-attempts", "market", "bid-margin"}

// createBody is POST /api/v1/gpu/instances's request.
type createBody struct {
	Provider     string            `json:"provider,omitempty"`
	OfferID      string            `json:"offer_id,omitempty"`
	Image        string            `json:"image"`
	Label        string            `json:"label,omitempty"`
	Hours        int               `json:"hours,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
	Ports        []int             `json:"ports,omitempty"`
	ImageLogin   string            `json:"image_login,omitempty"`
	Onstart      string            `json:"onstart,omitempty"`
	Args         []string          `json:"args,omitempty"`
	ConfirmToken string            `json:"confirm_token,omitempty"`
	Spec         *specBody         `json:"spec,omitempty"`
	lifetimeBody
}

// specBody is the request's spec object.
type specBody struct {
	GPU             []string        `json:"gpu,omitempty"`
	MinVRAMGB       float64         `json:"min_vram_gb,omitempty"`
	NumGPUs         int             `json:"num_gpus,omitempty"`
	MaxPricePerHour gpuproxy.Micros `json:"max_price_per_hour"`
	Providers       []string        `json:"providers,omitempty"`
	MinReliability  float64         `json:"min_reliability,omitempty"`
	Locations       []string        `json:"locations,omitempty"`
	Billing         string          `json:"billing,omitempty"`
	Hours           int             `json:"hours,omitempty"`
	MaxAttempts     int             `json:"max_attempts,omitempty"`
	Market          string          `json:"market,omitempty"`
	BidMargin       *float64        `json:"bid_margin,omitempty"`
}

// instanceReply is the part of the API's instance the CLI prints.
type instanceReply struct {
	ID           string          `json:"id"`
	Provider     string          `json:"provider"`
	OfferID      string          `json:"offer_id"`
	GPUName      string          `json:"gpu_name"`
	NumGPUs      int             `json:"num_gpus"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	Status       string          `json:"status"`
	Market       string          `json:"market"`
	BidPerHour   gpuproxy.Micros `json:"bid_per_hour"`
	StatusMsg    string          `json:"status_msg"`
	CostToDate   gpuproxy.Micros `json:"cost_to_date"`
	Note         string          `json:"note"`
	Attempts     []attemptReply  `json:"attempts"`
	apiview.LifetimeJSON
}

// attemptReply is one offer a rent by spec tried.
type attemptReply struct {
	Provider     string          `json:"provider"`
	OfferID      string          `json:"offer_id"`
	GPUName      string          `json:"gpu_name"`
	NumGPUs      int             `json:"num_gpus"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	Outcome      string          `json:"outcome"`
	Error        string          `json:"error"`
	DurationMS   int64           `json:"duration_ms"`
}

// listFlag is a repeatable flag whose values may also be comma lists:
// --gpu A100 --gpu H100 and --gpu A100,H100 alike.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// cmdInstances is `gpuproxy instances create|update|keepalive`: a client
// of a running gpuproxy's REST API, acting as the key in GPUPROXY_API_KEY.
func cmdInstances(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newFlags("instances")
	url := f.String("url", "", "the gpuproxy to call (default GPUPROXY_URL, else the running sandbox, else "+DefaultServerURL+")")
	image := f.String("image", "", "container image, e.g. vllm/vllm-openai:latest (required)")
	label := f.String("label", "", "your label for the instance")
	hours := f.Int("hours", 0, "prepaid hours (io.net, or a spec's prepaid offers)")
	var env, ports multi
	f.Var(&env, "env", "KEY=VALUE for the container, repeatable")
	f.Var(&ports, "port", "container port to expose, repeatable")
	imageLogin := f.String("image-login", "", `a private image's registry login, "-u USER -p TOKEN [REGISTRY]" `+
		"(default GPUPROXY_IMAGE_LOGIN, which keeps it out of the shell's history)")
	onstart := f.String("onstart", "", "a shell script the instance runs when it starts (vast.ai; io.net runs none)")
	var cargs multi
	f.Var(&cargs, "arg", "an argument of the image's entrypoint, repeatable, in order")
	idem := f.String("idempotency-key", "", "a key of your choice: repeating the create with it returns the same instance")
	confirm := f.String("confirm-token", "", "the token of a confirmation_required answer, once a person agreed")
	provider := f.String("provider", "", "one offer: its provider (vast.ai, io.net)")
	offer := f.String("offer", "", "one offer: its offer_id from GET /api/v1/gpu/offers")
	var gpus, provs, locs listFlag
	f.Var(&gpus, "gpu", "by spec: acceptable GPU names (substrings, e.g. 4090), repeatable or a comma list")
	minVRAM := f.Float64("min-vram", 0, "by spec: least GB per GPU")
	numGPUs := f.Int("gpus", 0, "by spec: exact number of GPUs (default 1)")
	maxPrice := f.String("max-price", "", "by spec: the most you accept, USD per hour for the whole instance (required)")
	f.Var(&provs, "providers", "by spec: marketplaces to search (default all), repeatable or a comma list")
	minRel := f.Float64("min-reliability", 0, "by spec: least reliability, 0 to 1")
	f.Var(&locs, "location", "by spec: acceptable locations (substrings, e.g. US), repeatable or a comma list")
	billing := f.String("billing", "", "by spec: hourly or prepaid (default either)")
	attempts := f.Int("max-attempts", 0, "by spec: offers to try at most (default 5)")
	market := f.String("market", "", "by spec: on-demand (default), interruptible (a bid, may be preempted) or any")
	bidMargin := f.Float64("bid-margin", fleet.DefaultBidMargin,
		"by spec, interruptible: bid min_bid × (1 + this), capped by --max-price less storage")
	listStatus := f.String("status", "", "list: only instances in this status (e.g. running, preempted)")
	f.forSub("list", "status")
	lf := addLifetimeFlags(f)
	f.forSub("create", append([]string{"image", "label", "hours", "env", "port", "idempotency-key", "confirm-token",
		"provider", "offer", "image-login", "onstart", "arg"}, specFlags...)...)
	f.forSub("create update", lifetimeFlagNames...)
	if err := f.parse(args); err != nil {
		var h helpError
		if errors.As(err, &h) && len(usageLines("instances")) == 0 {
			// Until the overview lists this command, its help says it here.
			h.text = strings.Replace(h.text, "\n\nflags:", "\n"+instancesUsage+"\n"+instancesListUsage+"\n\nflags:", 1)
			return h
		}
		return err
	}
	set := setFlags(f)
	if len(f.args) > 0 && (f.args[0] == "update" || f.args[0] == "keepalive") {
		srv, err := apiTarget(*url, getenv)
		if err != nil {
			return err
		}
		return cmdInstanceLifetime(ctx, f.args, lf, set, srv, stdout)
	}
	if len(f.args) > 0 && (f.args[0] == "list" || f.args[0] == "show") {
		srv, err := apiTarget(*url, getenv)
		if err != nil {
			return err
		}
		return cmdInstancesShow(ctx, f.args, *listStatus, set, srv, stdout)
	}
	if len(f.args) != 1 || f.args[0] != "create" {
		return fmt.Errorf("usage: gpuproxy instances create --image IMAGE (--provider P --offer ID | --max-price USD [--gpu NAME]…), " +
			"instances update ID [lifetime flags], instances keepalive ID, instances list [--status S] or instances show ID; " +
			"gpuproxy instances --help lists the flags")
	}
	bySpec := false
	for _, n := range specFlags {
		bySpec = bySpec || set[n]
	}
	body := createBody{Provider: *provider, OfferID: *offer, Image: *image, Label: *label, Hours: *hours,
		ImageLogin: cmp.Or(*imageLogin, getenv("GPUPROXY_IMAGE_LOGIN")), Onstart: *onstart, Args: cargs,
		ConfirmToken: *confirm}
	switch {
	case bySpec && (*offer != "" || *provider != ""):
		return errors.New("--offer and --provider rent one offer; --max-price, --gpu and the other spec flags rent by spec: give one or the other")
	case !bySpec && *offer == "":
		return errors.New("--offer (with --provider) or --max-price is required: rent one offer from the offer search, " +
			"or by spec the cheapest live offer matching --gpu, --min-vram, … at or under --max-price USD per hour")
	case *image == "":
		return errors.New("--image is required: a container image such as vllm/vllm-openai:latest")
	}
	if bySpec {
		if *maxPrice == "" {
			return errors.New("--max-price is required to rent by spec: the most you accept per hour for the whole instance, in USD (e.g. 1.50)")
		}
		price, err := gpuproxy.ParseUSD(*maxPrice)
		if err != nil || price <= 0 {
			return fmt.Errorf("--max-price: give US dollars per hour greater than 0, e.g. 1.50 (got %q)", *maxPrice)
		}
		// A flag given is checked against the spec's field rules (the
		// table REST and MCP check with): --gpus 0 is no request for the
		// default, which leaving the flag out is.
		for _, c := range []struct {
			flag, field string
			check       func(gpuproxy.FieldRule) error
		}{
			{"gpus", "spec.num_gpus", func(r gpuproxy.FieldRule) error { return r.CheckInt(int64(*numGPUs)) }},
			{"max-attempts", "spec.max_attempts", func(r gpuproxy.FieldRule) error { return r.CheckInt(int64(*attempts)) }},
			{"hours", "spec.hours", func(r gpuproxy.FieldRule) error { return r.CheckInt(int64(*hours)) }},
			{"min-vram", "spec.min_vram_gb", func(r gpuproxy.FieldRule) error { return r.CheckFloat(*minVRAM) }},
			{"min-reliability", "spec.min_reliability", func(r gpuproxy.FieldRule) error { return r.CheckFloat(*minRel) }},
			{"max-price", "spec.max_price_per_hour", func(r gpuproxy.FieldRule) error { return r.CheckMicros(price) }},
		} {
			if set[c.flag] {
				if err := c.check(fleet.SpecRules.Rule(c.field)); err != nil {
					return fmt.Errorf("--%s: %s", c.flag, strings.TrimPrefix(gpuproxy.ErrorMessage(err), c.field+": "))
				}
			}
		}
		body.Spec = &specBody{GPU: gpus, MinVRAMGB: *minVRAM, NumGPUs: *numGPUs, MaxPricePerHour: price,
			Providers: provs, MinReliability: *minRel, Locations: locs, Billing: *billing, Hours: *hours,
			MaxAttempts: *attempts, Market: *market}
		if set["bid-margin"] {
			if err := fleet.SpecRules.Rule("spec.bid_margin").CheckFloat(*bidMargin); err != nil {
				return fmt.Errorf("--bid-margin: %s", strings.TrimPrefix(gpuproxy.ErrorMessage(err), "spec.bid_margin: "))
			}
			body.Spec.BidMargin = bidMargin
		}
		body.Hours = 0
	}
	var err error
	if body.lifetimeBody, err = lf.body(set); err != nil {
		return err
	}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %s: give KEY=VALUE", kv)
		}
		if body.Env == nil {
			body.Env = map[string]string{}
		}
		body.Env[k] = v
	}
	for _, p := range ports {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("--port %s: give a port number, e.g. 8000", p)
		}
		body.Ports = append(body.Ports, n)
	}
	srv, err := apiTarget(*url, getenv)
	if err != nil {
		return err
	}
	inst, err := callAPI(ctx, http.MethodPost, srv, "/api/v1/gpu/instances", *idem, body, specFlagOf, stderr)
	if err != nil {
		return err
	}
	return printCreated(stdout, inst)
}

// apiServer is the running gpuproxy a CLI command calls: its base URL,
// where that URL came from (said when it cannot be reached) and the key
// to call it with.
type apiServer struct {
	base, via, key string
}

// unreachable is the error of a request that reached no server at s.
func (s apiServer) unreachable(err error) error {
	return fmt.Errorf("cannot reach gpuproxy at %s (%s; start `gpuproxy serve`, or set --url or GPUPROXY_URL): %w",
		s.base, s.via, err)
}

// apiTarget is the gpuproxy to call: --url, else GPUPROXY_URL, else the
// URL of the sandbox running on DATABASE_URL's database (or, with
// DATABASE_URL unset, the one of this folder, as `mcp --sandbox` finds
// it), else DefaultServerURL; and the key to call it with
// (GPUPROXY_API_KEY).
func apiTarget(urlFlag string, getenv func(string) string) (apiServer, error) {
	s := apiServer{key: getenv("GPUPROXY_API_KEY")}
	if s.key == "" {
		return s, errors.New("GPUPROXY_API_KEY must hold the API key to act as (an assistant or engineer key)")
	}
	s.base, s.via = urlFlag, "--url"
	if s.base == "" {
		s.base, s.via = getenv("GPUPROXY_URL"), "GPUPROXY_URL"
	}
	if s.base == "" {
		if sb, ok := runningSandbox(getenv); ok {
			s.base, s.via = sb.URL, sb.describe()+", found through its state file"
		}
	}
	if s.base == "" {
		s.base, s.via = DefaultServerURL, "the default: no --url, GPUPROXY_URL or running sandbox"
	}
	s.base = strings.TrimRight(s.base, "/")
	return s, nil
}

// runningSandbox is the `serve --sandbox` running on DATABASE_URL's
// database, or with DATABASE_URL unset on this folder's sandboxDB.
func runningSandbox(getenv func(string) string) (sandboxState, bool) {
	if u := getenv("DATABASE_URL"); u != "" {
		return sandboxFor(u)
	}
	path, err := filepath.Abs(sandboxDB)
	if err != nil {
		return sandboxState{}, false
	}
	return sandboxFor("sqlite:" + path)
}

// callAPI sends one request about an instance (body nil: none) and
// decodes the instance, or turns the API's error into one naming the
// CLI's flags (names: API field → flag; the offers tried, if any, go to
// stderr first).
func callAPI(ctx context.Context, method string, srv apiServer, path, idem string, body any, names map[string]string,
	stderr io.Writer) (instanceReply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return instanceReply{}, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, instancesTimeout)
	defer cancel()
	url := srv.base + path
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return instanceReply{}, fmt.Errorf("--url %s: %w", srv.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-API-Key", srv.key)
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return instanceReply{}, srv.unreachable(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return instanceReply{}, fmt.Errorf("reading the answer of %s %s: %w", method, url, err)
	}
	if res.StatusCode/100 == 2 {
		var inst instanceReply
		if err := json.Unmarshal(raw, &inst); err != nil || inst.ID == "" {
			return instanceReply{}, fmt.Errorf("%s %s: HTTP %d with an answer that is not an instance: %.200s", method, url,
				res.StatusCode, raw)
		}
		return inst, nil
	}
	e, ok := apiError(raw)
	if !ok {
		return instanceReply{}, fmt.Errorf("%s %s: HTTP %d: %.200s", method, url, res.StatusCode, raw)
	}
	if tried := detailAttempts(e.Details); len(tried) > 0 {
		fmt.Fprintf(stderr, "offers tried, in order:\n")
		_ = writeAttempts(stderr, tried)
	}
	err = argErr(e, names, nil)
	if tok, _ := e.Details["confirm_token"].(string); tok != "" {
		err = fmt.Errorf("%w\nonce a person agrees, rerun the same command with --confirm-token %s", err, tok)
	}
	return instanceReply{}, err
}

// detailAttempts reads the attempts an error's details carry.
func detailAttempts(d map[string]any) []attemptReply {
	if d["attempts"] == nil {
		return nil
	}
	b, err := json.Marshal(d["attempts"])
	if err != nil {
		return nil
	}
	var out []attemptReply
	if json.Unmarshal(b, &out) != nil {
		return nil
	}
	return out
}

// printCreated prints the instance and, for a rent by spec, the offers it
// tried.
func printCreated(w io.Writer, inst instanceReply) error {
	gpu := inst.GPUName
	if inst.NumGPUs > 1 {
		gpu = fmt.Sprintf("%d× %s", inst.NumGPUs, inst.GPUName)
	}
	verb := "rented"
	if inst.Status == string(gpuproxy.Pending) {
		verb = "asked for" // the note says the provider has not confirmed it yet
	}
	fmt.Fprintf(w, "%s %s: %s on %s (offer %s) at %s/h, %s\n", verb, inst.ID, gpu, inst.Provider, inst.OfferID,
		usd(inst.PricePerHour), inst.Status)
	if inst.Market == gpuproxy.MarketInterruptible {
		fmt.Fprintf(w, "market: %s\n", marketLine(inst))
	}
	return printInstanceTail(w, inst)
}

// printInstanceTail prints what every view of one instance ends with: its
// note, its lifetime rules and, for a rent by spec, the offers it tried.
func printInstanceTail(w io.Writer, inst instanceReply) error {
	if inst.Note != "" {
		fmt.Fprintf(w, "note: %s\n", inst.Note)
	}
	fmt.Fprintf(w, "lifetime: %s\n%s\n", rulesLine(inst.LifetimeJSON), nextLine(inst.LifetimeJSON, inst.Status, time.Now()))
	if len(inst.Attempts) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%s\n", attemptsLine(inst.Attempts))
	return writeAttempts(w, inst.Attempts)
}

// attemptsLine sums the attempts up: "tried 3 offers: 2 offer_gone, then
// rented".
func attemptsLine(as []attemptReply) string {
	if len(as) == 1 {
		return "tried 1 offer: " + as[0].Outcome
	}
	counts := map[string]int{}
	var order []string
	for _, a := range as[:len(as)-1] {
		if counts[a.Outcome] == 0 {
			order = append(order, a.Outcome)
		}
		counts[a.Outcome]++
	}
	parts := make([]string, len(order))
	for i, o := range order {
		parts[i] = fmt.Sprintf("%d %s", counts[o], o)
	}
	return fmt.Sprintf("tried %d offers: %s, then %s", len(as), strings.Join(parts, ", "), as[len(as)-1].Outcome)
}

// writeAttempts writes the attempts as a table.
func writeAttempts(w io.Writer, as []attemptReply) error {
	rows := [][]any{{"PROVIDER", "OFFER", "GPU", "PRICE/H", "OUTCOME", "TIME", "ERROR"}}
	for _, a := range as {
		gpu := a.GPUName
		if a.NumGPUs > 1 {
			gpu = fmt.Sprintf("%d× %s", a.NumGPUs, a.GPUName)
		}
		msg := "-"
		if a.Error != "" {
			// The provider column already names the provider.
			msg = clipText(strings.TrimPrefix(a.Error, a.Provider+": "), 80)
		}
		rows = append(rows, []any{a.Provider, a.OfferID, gpu, a.PricePerHour, a.Outcome,
			(time.Duration(a.DurationMS) * time.Millisecond).String(), msg})
	}
	return writeTable(w, rows)
}

// clipText shortens s to n runes for a table cell.
func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
