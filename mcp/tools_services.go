package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/services"
)

// Services on MCP: create_service, list_services, get_service,
// update_service and delete_service call the services.Manager as REST's
// /api/v1/services routes do. A service's arguments are its definition's
// JSON (services.Definition), decoded by services.DecodeDefinition, so
// every surface refuses the same input naming the same field.

// serviceOutput is one service, as REST shows it (services.View), with a
// sentence on what happened and what to do next.
type serviceOutput struct {
	services.View
	// ToDate is, from get_service on a server with unit economics, what
	// the service cost and carried since it was created (as REST's
	// GET /api/v1/services/{id}).
	ToDate  *economics.ToDate `json:"to_date,omitempty"`
	Message string            `json:"message" jsonschema:"what happened and what to do next"`
}

// servicesOutput is the caller's services.
type servicesOutput struct {
	Services []services.View `json:"services" jsonschema:"your services, by name"`
}

// viewSchema is the output schema of a services.View, with the
// definition's bounds ("replicas") made sure of: a client validating the
// result refuses any property the schema lacks.
func viewSchema() *jsonschema.Schema {
	s := outputSchema[services.View]()
	if _, ok := s.Properties["replicas"]; !ok {
		r := outputSchema[services.ReplicasJSON]()
		r.Description = "the bounds of the service's size"
		s.Properties["replicas"] = r
	}
	return s
}

// serviceOutputSchema is serviceOutput's schema: a view and its message.
func serviceOutputSchema() *jsonschema.Schema {
	s := viewSchema()
	s.Properties["message"] = &jsonschema.Schema{Type: "string", Description: "what happened and what to do next"}
	s.Required = append(s.Required, "message")
	td := outputSchema[economics.ToDate]()
	td.Description = "get_service only: what the service cost and carried from its creation (from) to now (to): " +
		"the unit economics summary by service over that period (GPU cost: its replicas' ledger charges, idle " +
		"time included; proxy charges: what its calls were charged; tokens in and out)"
	s.Properties["to_date"] = td
	return s
}

// servicesOutputSchema is servicesOutput's schema.
func servicesOutputSchema() *jsonschema.Schema {
	return &jsonschema.Schema{Type: "object", Required: []string{"services"},
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}},
		Properties: map[string]*jsonschema.Schema{"services": {Type: "array", Description: "your services, by name",
			Items: viewSchema()}}}
}

// serviceHints are the next steps of the service tools' refusals, where
// the instance tools' (whatToDo) would mislead.
var serviceHints = map[string]string{
	gpuproxy.ENOTFOUND: "Check the name: list_services lists your services.",
	gpuproxy.ECONFLICT: "Each of your services needs its own name and model (list_services lists them); " +
		"change an existing one with update_service. A service being deleted cannot change.",
}

// serviceTools are the tools over the caller's services.
func (s *Server) serviceTools() []toolSpec {
	provs := s.svc.Fleet.ProviderNames()
	ident := required("service", str("the service's name, or its id (svc_…)", 200))
	return []toolSpec{
		newTool(s, &sdk.Tool{
			Name:  "create_service",
			Title: "Create a service",
			Description: "Create a service: one OpenAI-compatible endpoint for a model over GPU replicas that " +
				"gpuproxy rents by spec, keeps ready, replaces when they die and scales between replicas.min and " +
				"replicas.max on requests in flight. Clients call base_url (" + services.BaseURL + " on this gpuproxy: " +
				"/chat/completions, /completions, /embeddings, /models) with your API key as the bearer token and " +
				"model set to the service's model; requests go to the ready replica with the fewest in flight. " +
				"Every replica is a rent by spec through your spending limits: a refused one leaves the service at " +
				"its size with a service.scale_blocked event, and never overspends. With replicas.min 0 the service " +
				"has no replica until a request arrives (it waits up to queue_timeout) and scales back to zero after " +
				"lifetime.idle_timeout. Returns at once: the replicas start in the background; follow them with " +
				"get_service.",
			InputSchema:  object(serviceFields(provs, true)...),
			OutputSchema: serviceOutputSchema(),
			Annotations: &sdk.ToolAnnotations{Title: "Create a service", DestructiveHint: boolPtr(false),
				OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeInstancesWrite, s.createService),
		newTool(s, &sdk.Tool{
			Name:  "list_services",
			Title: "Your services",
			Description: "List your services by name: model, state, ready and desired replicas, replicas.min and " +
				"max, the price cap per replica and base_url, with each one's replicas (instances).",
			InputSchema:  object(),
			OutputSchema: servicesOutputSchema(),
			Annotations:  readOnly("Your services", false),
		}, gpuproxy.ScopeInstancesRead, s.listServices),
		newTool(s, &sdk.Tool{
			Name:  "get_service",
			Title: "Show a service",
			Description: "Show one of your services: its definition (defaults filled), state, its replicas as " +
				"instances (instance, state, provider, GPU, price, when ready), its 20 latest events, newest first " +
				"(scale-ups, refused rents, replacements, readiness), and to_date: its GPU cost, proxy charges, " +
				"requests and tokens in and out since it was created.",
			InputSchema:  object(ident),
			OutputSchema: serviceOutputSchema(),
			Annotations:  readOnly("Show a service", false),
		}, gpuproxy.ScopeInstancesRead, s.getService),
		newTool(s, &sdk.Tool{
			Name:  "update_service",
			Title: "Change a service",
			Description: "Change one of your services: give service and only the fields to change (nested " +
				"objects are merged: replicas: {max: 4} keeps replicas.min). The name cannot change. The " +
				"controller brings the replicas within the new bounds (lowering replicas.max drains and destroys " +
				"the extra ones); running replicas keep their spec, image, env and port until they are replaced.",
			InputSchema:  object(append([]field{ident}, serviceFields(provs, false)...)...),
			OutputSchema: serviceOutputSchema(),
			Annotations: &sdk.ToolAnnotations{Title: "Change a service", DestructiveHint: boolPtr(true),
				IdempotentHint: true, OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeInstancesWrite, s.updateService),
		newTool(s, &sdk.Tool{
			Name:  "delete_service",
			Title: "Delete a service",
			Description: "Delete one of your services: it takes no new requests at once, its replicas finish the " +
				"requests in flight and are then destroyed (their billing stops), and the service is gone. Its " +
				"state is deleting until then; deleting it again returns it as it is.",
			InputSchema:  object(ident),
			OutputSchema: serviceOutputSchema(),
			Annotations: &sdk.ToolAnnotations{Title: "Delete a service", DestructiveHint: boolPtr(true),
				IdempotentHint: true, OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeInstancesWrite, s.deleteService),
	}
}

// serviceFields are the schemas of a definition's fields, in order: all
// of them for create_service (name, model, spec, image and port
// required), all but name, none required, for update_service.
func serviceFields(provs []string, create bool) []field {
	opt := optional
	if create {
		opt = required
	}
	dur := func(desc, bounds string) *jsonschema.Schema {
		return str(desc+`: a duration such as "30s" or "5m" (`+bounds+`)`, 40)
	}
	spec := specSchema(provs)
	spec.Description = "what each replica must be: gpuproxy rents the cheapest live offer matching it for every " +
		"replica (then the more reliable), failing over when one is taken; max_price_per_hour is per replica"
	if !create {
		// Merged over the current spec: max_price_per_hour may stay.
		spec.Required = nil
	}
	// A replica's market is the service's placement's, not the spec's.
	delete(spec.Properties, "market")
	spec.PropertyOrder = slices.DeleteFunc(spec.PropertyOrder, func(n string) bool { return n == "market" })
	var fs []field
	if create {
		fs = append(fs, required("name", str("the service's name, unique among your services: 1-63 characters of "+
			"a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. llama-8b)", 63)))
	}
	return append(fs,
		opt("model", str("the model name clients send in a request's \"model\" (e.g. meta-llama/Llama-3.1-8B-Instruct), "+
			"unique among your services", 200)),
		opt("spec", spec),
		opt("image", str("container image each replica runs, serving an OpenAI-compatible API on port (e.g. "+
			"vllm/vllm-openai:latest)", 500)),
		optional("env", stringMap("environment variables of each replica's container", 50, 4096)),
		opt("port", integer("the replica's OpenAI-compatible server port (e.g. 8000)", 1, 65535)),
		optional("replicas", object(
			optional("min", integer("fewest replicas kept (default 1); 0 scales to zero: no replica until a "+
				"request arrives", 0, services.MaxReplicas)),
			optional("max", integer("most replicas the load may scale to (default replicas.min, at least 1)", 1,
				services.MaxReplicas)))),
		optional("readiness", object(
			optional("path", str("GET path that answers 2xx once a replica can serve (default "+
				services.DefaultReadinessPath+")", 200)),
			optional("timeout", dur("how long each check may take", "default "+fmtDur(services.DefaultReadinessTimeout)+
				", 1s to 5m")),
			optional("initial_delay", dur("how long after the instance runs the first check waits (a model "+
				"loading)", "default 0, at most 1h")))),
		optional("scale", object(
			optional("target_inflight_per_replica", integer(fmt.Sprintf("requests in flight per ready replica "+
				"to aim for (default %d): above it for up_delay scales up, under half of it for down_delay "+
				"scales down", services.DefaultTargetInflight), 1, 10000)),
			optional("up_delay", dur("how long the load must stay above target before a scale-up",
				"default "+fmtDur(services.DefaultUpDelay)+", at most 24h")),
			optional("down_delay", dur("how long the load must stay under half the target before a scale-down",
				"default "+fmtDur(services.DefaultDownDelay)+", at most 24h")))),
		optional("queue_timeout", dur("how long a request waits for a ready replica before 503 with Retry-After",
			"default "+fmtDur(services.DefaultQueueTimeout)+", at most "+fmtDur(services.MaxQueueTimeout))),
		optional("lifetime", object(
			optional("idle_timeout", dur("destroy a replica after no request for this long; only with "+
				"replicas.min 0, where it is how the service scales to zero", `"0" for never`)),
			optional("max_duration", dur("destroy (and replace) a replica once it has run this long",
				`"0" for none`)))),
		optional("token_price", tokenPriceSchema()),
		optional("placement", enum("the market replicas are rented on: on-demand (the default), interruptible "+
			"(bids, much cheaper, that the provider may preempt; spread over machines and locations, overprovision "+
			"extra) or interruptible-with-fallback (interruptible, with on-demand replicas rented while interruptible "+
			"ones are short and released when they are back); a preempted replica takes no requests and is replaced "+
			"at once", string(gpuproxy.PlacementOnDemand), string(gpuproxy.PlacementInterruptible),
			string(gpuproxy.PlacementFallback))),
		optional("overprovision", ruleSchema(services.DefinitionRules, "overprovision", fmt.Sprintf("interruptible "+
			"replicas kept beyond what the load needs (default %d for interruptible placements, 0 for on-demand); "+
			"replicas.min + overprovision must be at most replicas.max", services.DefaultOverprovision))),
		optional("preempted_grace", dur("how long a preempted replica is kept, paused, in case it resumes by "+
			"itself (then it serves again and the surplus is drained); destroyed after it",
			"default "+fmtDur(services.DefaultPreemptedGrace)+`, "0" destroys it at once, at most `+
				fmtDur(services.MaxPreemptedGrace))),
	)
}

// tokenPriceSchema is a service's own per-token price: what its callers
// are charged, so only an admin key may set or change it (see
// services.PriceScope).
func tokenPriceSchema() *jsonschema.Schema {
	tp := object(
		required("input_per_1m", ruleSchema(services.DefinitionRules, "token_price.input_per_1m",
			"USD charged per million prompt tokens")),
		required("output_per_1m", ruleSchema(services.DefinitionRules, "token_price.output_per_1m",
			"USD charged per million completion tokens")))
	tp.Description = "the service's own per-token price, charged to its callers in place of the account's; " +
		"setting, changing or removing it needs the " + string(services.PriceScope) + " scope"
	return tp
}

// fmtDur prints a default duration as a definition writes it: "5m", not
// "5m0s".
func fmtDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

func (s *Server) createService(ctx context.Context, c call, in json.RawMessage) (result, error) {
	d, err := services.DecodeDefinition(c.wire(in), nil)
	if err != nil {
		return result{}, err
	}
	v, err := s.svc.Services.Create(ctx, c.p, d)
	if err != nil {
		return result{}, err
	}
	out := serviceOutput{View: v}
	least := minReplicas(v)
	if least == 0 {
		out.Message = fmt.Sprintf("Service %s is created with no replica: the first request for model %q rents one "+
			"(it waits up to queue_timeout %s for it to be ready).", v.Name, v.Model, v.QueueTimeout)
	} else {
		out.Message = fmt.Sprintf("Service %s is created: gpuproxy now rents its %s by spec, each through your "+
			"spending limits (a refused rent shows as a service.scale_blocked event). Follow them with get_service %s.",
			v.Name, plainPlural(least, "replica", "replicas"), v.Name)
	}
	out.Message += fmt.Sprintf(" Clients call base_url %s on this gpuproxy with model %q and your API key as the "+
		"bearer token.", v.BaseURL, v.Model)
	return result{serviceText("Created", out), out}, nil
}

func (s *Server) listServices(ctx context.Context, c call, _ struct{}) (result, error) {
	vs, err := s.svc.Services.List(ctx, c.p.AccountID)
	if err != nil {
		return result{}, err
	}
	out := servicesOutput{Services: vs}
	return result{servicesText(out), out}, nil
}

type serviceInput struct {
	Service string `json:"service"`
}

func (s *Server) getService(ctx context.Context, c call, in serviceInput) (result, error) {
	v, err := s.svc.Services.Get(ctx, c.p.AccountID, in.Service)
	if err != nil {
		return result{}, err
	}
	out := serviceOutput{View: v, Message: stateSentence(v)}
	if s.svc.Economics != nil {
		td, err := s.svc.Economics.ServiceToDate(ctx, c.p.AccountID, v.Name, v.CreatedAt)
		if err != nil {
			return result{}, err
		}
		out.ToDate = &td
	}
	return result{serviceText("Service", out), out}, nil
}

func (s *Server) updateService(ctx context.Context, c call, in json.RawMessage) (result, error) {
	in = c.wire(in)
	var args map[string]json.RawMessage
	if err := json.Unmarshal(in, &args); err != nil {
		return result{}, gpuproxy.Invalid("arguments", "must be an object")
	}
	var id string
	if err := json.Unmarshal(args["service"], &id); err != nil || id == "" {
		return result{}, gpuproxy.Invalid("service", "is required: the service's name or id")
	}
	delete(args, "service")
	if len(args) == 0 {
		return result{}, gpuproxy.Invalid("arguments", "give at least one field to change besides service "+
			"(model, spec, image, env, port, replicas, readiness, scale, queue_timeout, lifetime, token_price, "+
			"placement, overprovision, preempted_grace)")
	}
	patch, err := json.Marshal(args)
	if err != nil {
		return result{}, err
	}
	v, err := s.svc.Services.Update(ctx, c.p, id, patch)
	if err != nil {
		return result{}, err
	}
	out := serviceOutput{View: v}
	out.Message = fmt.Sprintf("Service %s is updated: %s. gpuproxy brings its replicas within these bounds; "+
		"running replicas keep their spec, image, env and port until they are replaced.", v.Name, boundsText(v))
	return result{serviceText("Updated", out), out}, nil
}

func (s *Server) deleteService(ctx context.Context, c call, in serviceInput) (result, error) {
	v, err := s.svc.Services.Delete(ctx, c.p.AccountID, in.Service)
	if err != nil {
		return result{}, err
	}
	out := serviceOutput{View: v}
	out.Message = fmt.Sprintf("Service %s is being deleted: it takes no new requests; its %s finish the "+
		"requests in flight and are then destroyed, which stops their billing. get_service %s shows it until it "+
		"is gone.", v.Name, plainPlural(len(v.Instances), "replica", "replicas"), v.ID)
	if len(v.Instances) == 0 {
		out.Message = fmt.Sprintf("Service %s is being deleted: it takes no new requests and has no replica to "+
			"drain. get_service %s shows it until it is gone.", v.Name, v.ID)
	}
	return result{serviceText("Deleting", out), out}, nil
}

func minReplicas(v services.View) int {
	if v.Definition.Replicas != nil && v.Definition.Replicas.Min != nil {
		return *v.Definition.Replicas.Min
	}
	return 0
}

func maxReplicas(v services.View) int {
	if v.Definition.Replicas != nil {
		return v.Definition.Replicas.Max
	}
	return 0
}

// boundsText is "1 of 2 replicas ready (desired 2, min 1, max 4)".
func boundsText(v services.View) string {
	return fmt.Sprintf("%d of %s ready (desired %d, min %d, max %d)", v.Ready,
		plainPlural(v.Desired, "replica", "replicas"), v.Desired, minReplicas(v), maxReplicas(v))
}

// stateSentence says where a service stands and what to do about it.
func stateSentence(v services.View) string {
	switch {
	case v.State == string(gpuproxy.ServiceDeleting):
		return fmt.Sprintf("Service %s is being deleted: its replicas drain and are destroyed.", v.Name)
	case v.Ready > 0:
		return fmt.Sprintf("Service %s serves model %q at base_url %s: %s.", v.Name, v.Model, v.BaseURL, boundsText(v))
	case v.Desired == 0:
		return fmt.Sprintf("Service %s has no replica: the next request for model %q rents one.", v.Name, v.Model)
	}
	return fmt.Sprintf("Service %s has no ready replica yet (%s): requests wait up to queue_timeout %s for one. "+
		"Its events say why (e.g. service.scale_blocked: a rent refused by your spending limits).", v.Name,
		boundsText(v), v.QueueTimeout)
}

// plainPlural is "1 replica", "2 replicas".
func plainPlural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// specText is a replica's spec in a line: "gpu RTX 4090 or A100, ≤
// $1.50/h, vast.ai".
func specText(sp *services.SpecJSON) string {
	if sp == nil {
		return "-"
	}
	var parts []string
	if len(sp.GPU) > 0 {
		parts = append(parts, "gpu "+strings.Join(sp.GPU, " or "))
	}
	if sp.NumGPUs > 1 {
		parts = append(parts, fmt.Sprintf("%d GPUs", sp.NumGPUs))
	}
	if sp.MinVRAMGB > 0 {
		parts = append(parts, fmt.Sprintf("≥ %g GB", sp.MinVRAMGB))
	}
	parts = append(parts, "≤ $"+sp.MaxPricePerHour.String()+"/h")
	if len(sp.Providers) > 0 {
		parts = append(parts, strings.Join(sp.Providers, ", "))
	}
	if len(sp.Locations) > 0 {
		parts = append(parts, "in "+strings.Join(sp.Locations, ", "))
	}
	return strings.Join(parts, ", ")
}

// serviceText renders one service: a heading, its definition in a few
// lines, its replicas and its events as tables, and the message.
func serviceText(verb string, o serviceOutput) string {
	v := o.View
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s): model %q, %s, %s.\n", verb, v.Name, v.ID, v.Model, v.State, boundsText(v))
	fmt.Fprintf(&b, "Each replica: %s; image %s, port %d.\n", specText(v.Spec), v.Image, v.Port)
	if r, sc := v.Readiness, v.Scale; r != nil && sc != nil {
		fmt.Fprintf(&b, "Ready when GET %s answers 2xx (timeout %s); scales at %d requests in flight per replica "+
			"(up after %s, down after %s); requests wait up to %s for a replica.\n", r.Path, r.Timeout,
			sc.TargetInflightPerReplica, sc.UpDelay, sc.DownDelay, v.QueueTimeout)
	}
	if l := v.Lifetime; l != nil && (l.IdleTimeout != "0" && l.IdleTimeout != "" || l.MaxDuration != "0" && l.MaxDuration != "") {
		fmt.Fprintf(&b, "Replica lifetime: idle_timeout %s, max_duration %s.\n", l.IdleTimeout, l.MaxDuration)
	}
	if td := o.ToDate; td != nil {
		fmt.Fprintf(&b, "Since %s UTC: GPU cost %s, proxy charges %s; %d tokens in, %d out over %d requests.\n",
			td.From.UTC().Format(time.DateTime), usd(td.GPUCost), usd(td.ProxyCharges), td.PromptTokens,
			td.CompletionTokens, td.Requests)
	}
	b.WriteString("\n")
	if len(v.Instances) == 0 {
		b.WriteString("No replicas.\n")
	} else {
		replicasTable(&b, v.Instances)
	}
	if len(v.Events) > 0 {
		b.WriteString("\nLatest events, newest first:\n")
		rows := [][]string{{"time (UTC)", "event", "instance", "message"}}
		for _, e := range v.Events {
			rows = append(rows, []string{e.At.UTC().Format(time.DateTime), e.Kind, dash(e.InstanceID), clip(e.Message, 100)})
		}
		table(&b, rows)
	}
	if o.Message != "" {
		b.WriteString("\n" + o.Message + "\n")
	}
	return b.String()
}

func replicasTable(b *strings.Builder, rs []services.ReplicaView) {
	rows := [][]string{{"instance", "state", "instance status", "provider", "gpu", "$/hour", "ready since", "reason"}}
	for _, r := range rs {
		ready := "-"
		if r.ReadyAt != nil {
			ready = r.ReadyAt.UTC().Format(time.DateTime)
		}
		rows = append(rows, []string{r.InstanceID, r.State, dash(r.Instance), dash(r.Provider), dash(r.GPUName),
			usd(r.PricePerHour), ready, dash(r.Reason)})
	}
	table(b, rows)
}

// servicesText renders the caller's services as a table.
func servicesText(o servicesOutput) string {
	if len(o.Services) == 0 {
		return "You have no services. Create one with create_service.\n"
	}
	var b strings.Builder
	rows := [][]string{{"name", "model", "state", "ready/desired", "min-max", "cap $/h per replica", "base_url", "id"}}
	for _, v := range o.Services {
		price := "-"
		if v.Spec != nil {
			price = "$" + v.Spec.MaxPricePerHour.String()
		}
		rows = append(rows, []string{v.Name, clip(v.Model, 60), v.State, fmt.Sprintf("%d/%d", v.Ready, v.Desired),
			fmt.Sprintf("%d-%d", minReplicas(v), maxReplicas(v)), price, v.BaseURL, v.ID})
	}
	table(&b, rows)
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// wire returns the arguments as the client sent them, for the field
// table's checks: the SDK hands the handler arguments it decoded and
// encoded again, where a number such as 1e-400 for an integer field has
// already become 0 and so would pass for a valid value.
func (c call) wire(in json.RawMessage) json.RawMessage {
	if c.req != nil && c.req.Params != nil && len(c.req.Params.Arguments) > 0 {
		return c.req.Params.Arguments
	}
	return in
}
