package services

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// Defaults and bounds of a service's settings.
const (
	DefaultReadinessPath    = "/v1/models"
	DefaultReadinessTimeout = 5 * time.Second
	DefaultTargetInflight   = 4
	DefaultUpDelay          = 30 * time.Second
	DefaultDownDelay        = 5 * time.Minute
	DefaultQueueTimeout     = 30 * time.Second
	// MaxReplicas bounds replicas.max.
	MaxReplicas = 64
	// MaxQueueTimeout bounds queue_timeout.
	MaxQueueTimeout = 10 * time.Minute
	// DefaultOverprovision is overprovision for an interruptible
	// placement that does not set it: one replica beyond the load's
	// while preemptions are recent, so one more preemption leaves the
	// load covered while its replacement starts.
	DefaultOverprovision = 1
	// DefaultPreemptedGrace is how long a preempted replica is kept,
	// paused, in case it resumes (preempted_grace): vast.ai resumes a
	// paused bid when whoever outranked it leaves, often within minutes.
	DefaultPreemptedGrace = 10 * time.Minute
	// MaxPreemptedGrace bounds preempted_grace (a paused instance bills
	// its storage).
	MaxPreemptedGrace = 24 * time.Hour
)

// DefinitionRules are the rules of a definition's numeric, duration and
// list fields: the spec's as any create's (fleet.SpecRules), and the
// service's own. DecodeDefinition checks the JSON against them (a create's
// body and an update's patch alike) before anything is decoded, so REST,
// MCP and the CLI refuse the same value naming the same field and range.
var DefinitionRules = append(append(gpuproxy.FieldRules{}, fleet.SpecRules...), gpuproxy.FieldRules{
	{Name: "port", Kind: gpuproxy.FieldInteger, Min: 1, Max: 65535},
	{Name: "replicas.min", Kind: gpuproxy.FieldInteger, Min: 0, Max: MaxReplicas},
	{Name: "replicas.max", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxReplicas},
	{Name: "readiness.timeout", Kind: gpuproxy.FieldDuration, MinDuration: time.Second, MaxDuration: 5 * time.Minute},
	{Name: "readiness.initial_delay", Kind: gpuproxy.FieldDuration, MaxDuration: time.Hour},
	{Name: "scale.target_inflight_per_replica", Kind: gpuproxy.FieldInteger, Min: 1, Max: 10000},
	{Name: "scale.up_delay", Kind: gpuproxy.FieldDuration, MaxDuration: 24 * time.Hour},
	{Name: "scale.down_delay", Kind: gpuproxy.FieldDuration, MaxDuration: 24 * time.Hour},
	{Name: "queue_timeout", Kind: gpuproxy.FieldDuration, MaxDuration: MaxQueueTimeout},
	{Name: "lifetime.idle_timeout", Kind: gpuproxy.FieldDuration, MinDuration: fleet.MinLifetimeDuration,
		MaxDuration: fleet.MaxIdleTimeout, Zero: "never"},
	{Name: "lifetime.max_duration", Kind: gpuproxy.FieldDuration, MinDuration: fleet.MinLifetimeDuration,
		MaxDuration: fleet.MaxLifetimeDuration, Zero: "none"},
	{Name: "token_price.input_per_1m", Kind: gpuproxy.FieldUSD, Min: 0, Max: maxTokenPriceUSD, Zero: "free"},
	{Name: "token_price.output_per_1m", Kind: gpuproxy.FieldUSD, Min: 0, Max: maxTokenPriceUSD, Zero: "free"},
	{Name: "overprovision", Kind: gpuproxy.FieldInteger, Min: 0, Max: MaxReplicas - 1},
	{Name: "preempted_grace", Kind: gpuproxy.FieldDuration, MaxDuration: MaxPreemptedGrace, Zero: "destroyed at once"},
}...)

// maxTokenPriceUSD bounds a service's token prices (USD per million
// tokens).
const maxTokenPriceUSD = float64(gpuproxy.MaxMicros) / gpuproxy.MicrosPerUSD

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62})$`)

// Definition is a service as clients write it: the REST body, the MCP
// tool's arguments and the CLI's file all take this JSON. Durations are
// strings ("30s", "5m"); max_price_per_hour is USD.
//
// Placement picks the market its replicas are rented on: "on-demand"
// (the default), "interruptible" (bids, cheaper, that the provider may
// preempt; spread over machines, then locations and providers, with
// overprovision extra replicas while preemptions are recent, default 1)
// or
// "interruptible-with-fallback" (the same, and on-demand replicas rented
// to cover a shortfall of interruptible ones, released when interruptible
// ones are ready again). A replica whose instance is preempted takes no
// requests from then on and is replaced at once; the paused instance is
// kept for preempted_grace (default 10m; "0": destroyed at once) in case
// it resumes — it is then ready again and the surplus is drained — and
// destroyed after it. Every replica is still a rent by spec through the
// guard rails; spec.max_price_per_hour caps each bid.
type Definition struct {
	Name         string            `json:"name"`
	Model        string            `json:"model"`
	Spec         *SpecJSON         `json:"spec"`
	Image        string            `json:"image"`
	Env          map[string]string `json:"env,omitempty"`
	Port         int               `json:"port"`
	Replicas     *ReplicasJSON     `json:"replicas,omitempty"`
	Readiness    *ReadinessJSON    `json:"readiness,omitempty"`
	Scale        *ScaleJSON        `json:"scale,omitempty"`
	QueueTimeout Duration          `json:"queue_timeout,omitempty"`
	Lifetime     *LifetimeJSON     `json:"lifetime,omitempty"`
	TokenPrice   *TokenPriceJSON   `json:"token_price,omitempty"`
	// Placement is "on-demand", "interruptible" or
	// "interruptible-with-fallback" ("": on-demand).
	Placement string `json:"placement,omitempty"`
	// Overprovision is how many interruptible replicas are kept beyond
	// what the load needs while preemptions are recent: within
	// preempted_grace of the last one, or of the controller's first pass
	// over the service, or while a replica is paused; throughout with a
	// preempted_grace of 0 (default 1 for interruptible placements, 0 and
	// only 0 for on-demand); replicas.min + overprovision must be at most
	// replicas.max (which defaults to that sum).
	Overprovision *int `json:"overprovision,omitempty"`
	// PreemptedGrace is how long a preempted replica is kept paused in
	// case it resumes ("10m" by default; "0": destroyed at once).
	PreemptedGrace Duration `json:"preempted_grace,omitempty"`
}

// TokenPriceJSON is a service's own per-token price, USD per million
// prompt (input) and completion (output) tokens: its callers are charged
// per token on its endpoint (admitted for their most expensive outcome,
// settled at the counted tokens), instead of proxy.token_price.
type TokenPriceJSON struct {
	InputPer1M  json.Number `json:"input_per_1m"`
	OutputPer1M json.Number `json:"output_per_1m"`
}

// SpecJSON is the replicas' rent spec (fleet.Spec), as the instance
// create's spec: gpu is one name or a list.
type SpecJSON struct {
	GPU             StringList  `json:"gpu,omitempty"`
	MinVRAMGB       float64     `json:"min_vram_gb,omitempty"`
	NumGPUs         int         `json:"num_gpus,omitempty"`
	MaxPricePerHour json.Number `json:"max_price_per_hour"`
	Providers       StringList  `json:"providers,omitempty"`
	MinReliability  float64     `json:"min_reliability,omitempty"`
	Locations       StringList  `json:"locations,omitempty"`
	Billing         string      `json:"billing,omitempty"`
	Hours           int         `json:"hours,omitempty"`
	MaxAttempts     int         `json:"max_attempts,omitempty"`
	// BidMargin is how far above an interruptible offer's minimum bid
	// each bid is (interruptible placements only).
	BidMargin *float64 `json:"bid_margin,omitempty"`
	// Market is refused: a service's placement sets each replica's
	// market.
	Market string `json:"market,omitempty"`
}

// ReplicasJSON bounds the service's size; min may be 0 (scale to zero).
type ReplicasJSON struct {
	Min *int `json:"min,omitempty"`
	Max int  `json:"max,omitempty"`
}

// ReadinessJSON is the replicas' readiness check.
type ReadinessJSON struct {
	Path         string   `json:"path,omitempty"`
	Timeout      Duration `json:"timeout,omitempty"`
	InitialDelay Duration `json:"initial_delay,omitempty"`
}

// ScaleJSON is when the service scales.
type ScaleJSON struct {
	TargetInflightPerReplica int      `json:"target_inflight_per_replica,omitempty"`
	UpDelay                  Duration `json:"up_delay,omitempty"`
	DownDelay                Duration `json:"down_delay,omitempty"`
}

// LifetimeJSON is every replica's lifetime rules. An idle replica is
// destroyed after idle_timeout ("0": never) — with replicas.min 0 this is
// how the service scales to zero; with min above 0 the controller keeps
// its replicas and idle_timeout must be unset or "0".
type LifetimeJSON struct {
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	MaxDuration Duration `json:"max_duration,omitempty"`
}

// Duration is a JSON duration string ("30s"); "" is unset.
type Duration string

// StringList is a JSON string or an array of strings.
type StringList []string

// UnmarshalJSON implements json.Unmarshaler: "A100" is ["A100"].
func (l *StringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &json.UnmarshalTypeError{Value: "other", Type: reflect.TypeFor[[]string]()}
	}
	*l = many
	return nil
}

// rule is the named field's rule in DefinitionRules.
func rule(name string) gpuproxy.FieldRule { return DefinitionRules.Rule(name) }

// DecodeDefinition reads a definition from JSON, refusing unknown fields
// and naming the field of a value of the wrong type. Over base (an update:
// the current definition), fields the JSON leaves out keep their values.
func DecodeDefinition(b []byte, base *Definition) (Definition, error) {
	if err := DefinitionRules.Check(b); err != nil {
		return Definition{}, err
	}
	var d Definition
	if base != nil {
		d = base.clone()
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		return Definition{}, jsonError(err, gpuproxy.JSONErrorField(b, &d, err))
	}
	if dec.More() {
		return Definition{}, gpuproxy.Invalid("body", "must be one JSON object")
	}
	if base != nil && d.Placement != base.Placement {
		// A new placement takes its own default overprovision unless the
		// patch sets one.
		var keys map[string]json.RawMessage
		if json.Unmarshal(b, &keys) == nil {
			if _, set := keys["overprovision"]; !set {
				d.Overprovision = nil
			}
		}
	}
	return d, nil
}

// jsonError is the invalid-input error of a definition the decoder
// refused with err; field, when set, is the field's full path in the body
// (gpuproxy.JSONErrorField: "spec.gpus", where err says "gpus").
func jsonError(err error, field string) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		t := jsonType(te.Type)
		article := "a "
		if strings.IndexByte("aeiou", t[0]) >= 0 {
			article = "an "
		}
		if field == "" {
			field = te.Field
		}
		return gpuproxy.Invalid(field, "must be %s%s", article, t)
	case errors.As(err, &se):
		return gpuproxy.Invalid("body", "is not valid JSON: %v", err)
	case strings.Contains(err.Error(), "into Number"):
		// json.Number refuses a string that is not a number (its error
		// names no field).
		return gpuproxy.Invalid("body", "prices (spec.max_price_per_hour, token_price.input_per_1m, "+
			"token_price.output_per_1m) must be numbers of USD, e.g. 1.50")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		if field != "" {
			f = field
		}
		return gpuproxy.Invalid(f, "is not a field of a service")
	}
	return gpuproxy.Invalid("body", "%s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonType(t reflect.Type) string {
	switch {
	case t == nil:
		return "value"
	case t == reflect.TypeFor[StringList]():
		return "string or an array of strings"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64:
		return "number"
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct || t.Kind() == reflect.Pointer:
		return "object"
	case t.Kind() == reflect.Slice:
		return "list"
	}
	return t.String()
}

// clone copies d deeply enough that decoding over the copy leaves d as it
// was.
func (d Definition) clone() Definition {
	b, _ := json.Marshal(d)
	var c Definition
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	_ = dec.Decode(&c)
	return c
}

// parse checks d, naming the field, and returns the service it defines
// (ID, account, key, state and times left to the caller) with its
// defaults filled.
func (d Definition) parse(known []string) (gpuproxy.Service, fleet.Spec, error) {
	var s gpuproxy.Service
	switch {
	case !nameRE.MatchString(d.Name):
		return s, fleet.Spec{}, gpuproxy.Invalid("name", "is required: 1-63 characters of a-z, 0-9, '.', '_' and '-', "+
			"starting with a letter or digit, got %q", truncate(d.Name, 80))
	case strings.TrimSpace(d.Model) == "" || len(d.Model) > 200 || strings.ContainsAny(d.Model, "\n\r\t"):
		return s, fleet.Spec{}, gpuproxy.Invalid("model", "is required: the model name clients send (1-200 characters)")
	case d.Spec == nil:
		return s, fleet.Spec{}, gpuproxy.Invalid("spec", "is required: what each replica must be, e.g. "+
			`{"gpu":"RTX 4090","max_price_per_hour":1.5}`)
	case d.Port == 0:
		return s, fleet.Spec{}, gpuproxy.Invalid("port", "is required: the replica's OpenAI-compatible server port, %s",
			rule("port").Range())
	}
	if err := rule("port").CheckInt(int64(d.Port)); err != nil {
		return s, fleet.Spec{}, err
	}
	placement, err := d.placement()
	if err != nil {
		return s, fleet.Spec{}, err
	}
	sp, err := d.Spec.spec()
	if err != nil {
		return s, fleet.Spec{}, err
	}
	if sp.BidMargin != nil && !placement.Interruptible() {
		return s, fleet.Spec{}, gpuproxy.Invalid("spec.bid_margin", "applies to interruptible replicas: set placement to %q or %q",
			gpuproxy.PlacementInterruptible, gpuproxy.PlacementFallback)
	}
	if placement.Interruptible() {
		sp.Market = fleet.MarketInterruptible // checked as the replicas' rents will be
	}
	// The spec, image, env and port as the fleet checks any create.
	probe := fleet.CreateRequest{Spec: &sp, Image: d.Image, Env: d.Env, Ports: []int{d.Port}}
	if err := probe.Check(known); err != nil {
		return s, fleet.Spec{}, err
	}
	sp.Market = "" // each rent sets it by the placement
	spec, _ := json.Marshal(sp)
	s = gpuproxy.Service{Name: d.Name, Model: d.Model, Spec: spec, Image: d.Image, Env: d.Env, Port: d.Port,
		MinReplicas: 1, MaxReplicas: 1,
		Readiness:    gpuproxy.Readiness{Path: DefaultReadinessPath, Timeout: DefaultReadinessTimeout},
		Scale:        gpuproxy.ScalePolicy{TargetInflight: DefaultTargetInflight, UpDelay: DefaultUpDelay, DownDelay: DefaultDownDelay},
		QueueTimeout: DefaultQueueTimeout, Placement: placement, PreemptedGrace: DefaultPreemptedGrace}
	if err := d.PreemptedGrace.into("preempted_grace", &s.PreemptedGrace); err != nil {
		return s, fleet.Spec{}, err
	}
	if o := d.Overprovision; o != nil {
		if err := rule("overprovision").CheckInt(int64(*o)); err != nil {
			return s, fleet.Spec{}, err
		}
		if *o > 0 && !placement.Interruptible() {
			return s, fleet.Spec{}, gpuproxy.Invalid("overprovision", "applies to interruptible placements (%q, %q): "+
				"an on-demand service keeps no extra replicas, got %d", gpuproxy.PlacementInterruptible, gpuproxy.PlacementFallback, *o)
		}
		s.Overprovision = *o
	} else if placement.Interruptible() {
		s.Overprovision = DefaultOverprovision
	}
	s.MaxReplicas = max(1, s.Overprovision+1)
	maxSet := false
	if r := d.Replicas; r != nil {
		if r.Min != nil {
			s.MinReplicas = *r.Min
		}
		s.MaxReplicas = max(s.MinReplicas+s.Overprovision, 1)
		if maxSet = r.Max != 0; maxSet {
			s.MaxReplicas = r.Max
		}
		if err := rule("replicas.min").CheckInt(int64(s.MinReplicas)); err != nil {
			return s, fleet.Spec{}, err
		}
		switch {
		case r.Max != 0 && (r.Max < s.MinReplicas || r.Max > MaxReplicas):
			return s, fleet.Spec{}, gpuproxy.Invalid("replicas.max", "must be between replicas.min (%d) and %d, got %d",
				s.MinReplicas, MaxReplicas, r.Max)
		}
	}
	if s.MinReplicas+s.Overprovision > s.MaxReplicas || s.MaxReplicas > MaxReplicas {
		why := fmt.Sprintf("the most replicas a service may have (%d)", MaxReplicas)
		if maxSet {
			why = fmt.Sprintf("replicas.max (%d)", s.MaxReplicas)
		}
		return s, fleet.Spec{}, gpuproxy.Invalid("overprovision", "replicas.min (%d) + overprovision (%d) must be at most %s",
			s.MinReplicas, s.Overprovision, why)
	}
	if r := d.Readiness; r != nil {
		if r.Path != "" {
			if !strings.HasPrefix(r.Path, "/") || len(r.Path) > 200 || strings.ContainsAny(r.Path, " \r\n\t?#") {
				return s, fleet.Spec{}, gpuproxy.Invalid("readiness.path", "must be a path starting with /, got %q", truncate(r.Path, 80))
			}
			s.Readiness.Path = r.Path
		}
		if err := r.Timeout.into("readiness.timeout", &s.Readiness.Timeout); err != nil {
			return s, fleet.Spec{}, err
		}
		if err := r.InitialDelay.into("readiness.initial_delay", &s.Readiness.InitialDelay); err != nil {
			return s, fleet.Spec{}, err
		}
	}
	if c := d.Scale; c != nil {
		if c.TargetInflightPerReplica != 0 {
			if err := rule("scale.target_inflight_per_replica").CheckInt(int64(c.TargetInflightPerReplica)); err != nil {
				return s, fleet.Spec{}, err
			}
			s.Scale.TargetInflight = c.TargetInflightPerReplica
		}
		if err := c.UpDelay.into("scale.up_delay", &s.Scale.UpDelay); err != nil {
			return s, fleet.Spec{}, err
		}
		if err := c.DownDelay.into("scale.down_delay", &s.Scale.DownDelay); err != nil {
			return s, fleet.Spec{}, err
		}
	}
	if err := d.QueueTimeout.into("queue_timeout", &s.QueueTimeout); err != nil {
		return s, fleet.Spec{}, err
	}
	if l := d.Lifetime; l != nil {
		if err := l.IdleTimeout.into("lifetime.idle_timeout", &s.Lifetime.IdleTimeout); err != nil {
			return s, fleet.Spec{}, err
		}
		if err := l.MaxDuration.into("lifetime.max_duration", &s.Lifetime.MaxDuration); err != nil {
			return s, fleet.Spec{}, err
		}
	}
	if s.MinReplicas > 0 && s.Lifetime.IdleTimeout > 0 {
		return s, fleet.Spec{}, gpuproxy.Invalid("lifetime.idle_timeout", "applies only with replicas.min 0 (scale to zero): "+
			"with min %d the service keeps its replicas, and scales down on load after scale.down_delay", s.MinReplicas)
	}
	s.Lifetime.IdleAction = gpuproxy.IdleDestroy
	if tp := d.TokenPrice; tp != nil {
		price := gpuproxy.TokenPrice{}
		for _, f := range []struct {
			name string
			in   json.Number
			out  *gpuproxy.Micros
		}{{"token_price.input_per_1m", tp.InputPer1M, &price.InputPer1M}, {"token_price.output_per_1m", tp.OutputPer1M, &price.OutputPer1M}} {
			if f.in == "" {
				continue
			}
			v, err := gpuproxy.ParseUSD(f.in.String())
			if err != nil {
				return s, fleet.Spec{}, gpuproxy.InvalidUSD(f.name, err, 0, gpuproxy.MaxMicros, "USD per million tokens")
			}
			if err := rule(f.name).CheckMicros(v); err != nil {
				return s, fleet.Spec{}, err
			}
			*f.out = v
		}
		s.TokenPrice = &price
	}
	return s, sp, nil
}

// checkPolicy checks the lifetime every replica of s would be rented with
// against the account's policy now, when the service is created or
// changed: a rule the policy refuses (max_duration over the account's
// maximum) is a 400 naming lifetime.<field>, not a rent refused on every
// retry of the controller.
func (m *Manager) checkPolicy(ctx context.Context, accountID int64, s gpuproxy.Service) error {
	err := m.fleet.CheckLifetime(ctx, accountID, replicaLifetime(s))
	var e *gpuproxy.Error
	if !errors.As(err, &e) || e.Code != gpuproxy.EINVALID {
		return err
	}
	f, _ := e.Details["field"].(string)
	if f == "" {
		return err
	}
	return gpuproxy.Invalid("lifetime."+f, "%s (the account's lifetime policy applies to every replica)",
		strings.TrimPrefix(e.Message, f+": "))
}

// placement is d's placement, checked ("" is on-demand).
func (d Definition) placement() (gpuproxy.Placement, error) {
	switch p := gpuproxy.Placement(d.Placement); p {
	case "":
		return gpuproxy.PlacementOnDemand, nil
	case gpuproxy.PlacementOnDemand, gpuproxy.PlacementInterruptible, gpuproxy.PlacementFallback:
		return p, nil
	}
	return "", gpuproxy.Invalid("placement", "must be %q, %q or %q, got %q", gpuproxy.PlacementOnDemand,
		gpuproxy.PlacementInterruptible, gpuproxy.PlacementFallback, truncate(d.Placement, 80))
}

func (in *SpecJSON) spec() (fleet.Spec, error) {
	if in.Market != "" {
		return fleet.Spec{}, gpuproxy.Invalid("spec.market", "is set by the service's placement (%q, %q or %q), "+
			"not by its spec", gpuproxy.PlacementOnDemand, gpuproxy.PlacementInterruptible, gpuproxy.PlacementFallback)
	}
	if in.MaxPricePerHour == "" {
		return fleet.Spec{}, gpuproxy.Invalid("spec.max_price_per_hour", "is required: the most you accept per hour "+
			"for each replica, in USD (e.g. 1.50)")
	}
	price, err := gpuproxy.ParseUSD(in.MaxPricePerHour.String())
	if err != nil {
		return fleet.Spec{}, gpuproxy.InvalidUSD("spec.max_price_per_hour", err, 0, gpuproxy.MaxMicros, "a number of USD per hour")
	}
	if err := rule("spec.max_price_per_hour").CheckMicros(price); err != nil {
		return fleet.Spec{}, err
	}
	return fleet.Spec{GPU: in.GPU, MinVRAMGB: in.MinVRAMGB, NumGPUs: in.NumGPUs, MaxPricePerHour: price,
		Providers: in.Providers, MinReliability: in.MinReliability, Locations: in.Locations, Billing: in.Billing,
		Hours: in.Hours, MaxAttempts: in.MaxAttempts, BidMargin: in.BidMargin}, nil
}

// into parses d into *out when it is set, checking it against the
// field's rule in DefinitionRules.
func (d Duration) into(field string, out *time.Duration) error {
	if d == "" {
		return nil
	}
	b, _ := json.Marshal(string(d))
	if err := rule(field).CheckJSON(b); err != nil {
		return err
	}
	v, _ := time.ParseDuration(strings.TrimSpace(string(d)))
	*out = v
	return nil
}

// DefinitionOf is the definition a stored service was made from (with
// its defaults filled): what an update starts from and show prints.
func DefinitionOf(s gpuproxy.Service) Definition {
	var sp fleet.Spec
	_ = json.Unmarshal(s.Spec, &sp)
	min := s.MinReplicas
	d := Definition{Name: s.Name, Model: s.Model, Image: s.Image, Env: s.Env, Port: s.Port,
		Spec: &SpecJSON{GPU: sp.GPU, MinVRAMGB: sp.MinVRAMGB, NumGPUs: sp.NumGPUs,
			MaxPricePerHour: json.Number(sp.MaxPricePerHour.String()), Providers: sp.Providers,
			MinReliability: sp.MinReliability, Locations: sp.Locations, Billing: sp.Billing, Hours: sp.Hours,
			MaxAttempts: sp.MaxAttempts, BidMargin: sp.BidMargin},
		Replicas:       &ReplicasJSON{Min: &min, Max: s.MaxReplicas},
		Readiness:      &ReadinessJSON{Path: s.Readiness.Path, Timeout: durationOf(s.Readiness.Timeout), InitialDelay: durationOf(s.Readiness.InitialDelay)},
		Scale:          &ScaleJSON{TargetInflightPerReplica: s.Scale.TargetInflight, UpDelay: durationOf(s.Scale.UpDelay), DownDelay: durationOf(s.Scale.DownDelay)},
		QueueTimeout:   durationOf(s.QueueTimeout),
		Lifetime:       &LifetimeJSON{IdleTimeout: durationOf(s.Lifetime.IdleTimeout), MaxDuration: durationOf(s.Lifetime.MaxDuration)},
		Placement:      string(cmp.Or(s.Placement, gpuproxy.PlacementOnDemand)),
		PreemptedGrace: durationOf(s.PreemptedGrace),
	}
	over := s.Overprovision
	d.Overprovision = &over
	if p := s.TokenPrice; p != nil {
		d.TokenPrice = &TokenPriceJSON{InputPer1M: json.Number(p.InputPer1M.String()), OutputPer1M: json.Number(p.OutputPer1M.String())}
	}
	return d
}

func durationOf(d time.Duration) Duration {
	if d == 0 {
		return "0"
	}
	return Duration(fmtDuration(d))
}

// fmtDuration prints d without trailing zero units ("5m", not "5m0s").
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
