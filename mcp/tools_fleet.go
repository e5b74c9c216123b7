package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/fleet"
)

// fleetTools are the tools over GPU providers and the caller's instances.
func (s *Server) fleetTools() []toolSpec {
	provs := s.svc.Fleet.ProviderNames()
	provDesc := "GPU marketplace: " + strings.Join(provs, " or ")
	statuses := []string{"pending", "starting", "running", "preempted", "stopped", "terminating", "terminated", "failed"}
	return append([]toolSpec{
		newTool(s, &sdk.Tool{
			Name:  "list_gpu_instances",
			Title: "Search GPU offers",
			Description: "Search live GPU offers across providers, cheapest first. Each offer's instance_id is what " +
				"create_gpu_instance rents. If a provider is down its error is listed and the others still answer. " +
				"Prices are USD per hour for the whole offer (all its GPUs).",
			InputSchema: object(
				optional("provider", withDefault(enum("which marketplace to search", append(provs, "all")...), "all")),
				optional("min_vram", number("minimum memory per GPU, in GB (e.g. 24)", 0, 10000)),
				optional("max_price", number("maximum price, in USD per hour for the whole offer", 0, 10000)),
				optional("gpu_name", str("GPU model to match, case-insensitive substring (e.g. 4090, H100)", 100)),
				optional("min_gpus", integer("minimum number of GPUs in the offer", 0, 64)),
				optional("limit", withDefault(integer("offers per page", 1, 500), 20)),
				optional("cursor", str("next_cursor from the previous page", 200)),
			),
			OutputSchema: outputSchema[offersOutput](),
			Annotations:  readOnly("Search GPU offers", true),
		}, gpuproxy.ScopeOffersRead, s.listOffers),
		newTool(s, &sdk.Tool{
			Name:  "create_gpu_instance",
			Title: "Rent a GPU instance",
			Description: "Rent a GPU instance and start image on it, in one of two forms. Either instance_id and " +
				"provider: one offer from list_gpu_instances. Or spec: gpuproxy searches the live offers, rents the " +
				"cheapest one matching it (then the more reliable), failing over to the next when one is taken; give " +
				"max_price_per_hour, the most you accept per hour, and only what matters (gpu, min_vram_gb, num_gpus, " +
				"providers, locations…). The result's attempts list each offer tried and how it ended (offer_gone, " +
				"provider_error, rented…); when nothing matches, the error no_matching_offer names the nearest misses " +
				"(e.g. the cheapest match over your cap) so you can decide what to relax. The spending guard rails " +
				"admit the cost first (vast.ai: price/hour × 1 h; io.net: the quoted total for hours; a spec: its cap); " +
				"a refusal names the window and its numbers. Waits for the instance to run, reporting progress when " +
				"asked, and returns it with its endpoint. Pass idempotency_key to make retries safe. If your key asks for a " +
				"person's confirmation above a cost, the person is asked (elicitation) when your client supports it; " +
				"otherwise the call fails with confirmation_required and a confirm_token: show the person the cost and, " +
				"if they agree, repeat the same call with confirm_token within 10 minutes. Lifetime rules keep a " +
				"forgotten instance from billing on: max_duration, idle_timeout (no proxied request for that long; " +
				"idle_action stop or destroy, after idle_grace) and spend_cap; an omitted idle_timeout gets the " +
				"account's default. Change them later with update_gpu_instance; keep_gpu_instance_alive restarts " +
				"the idle timeout.",
			InputSchema: object(append([]field{
				optional("provider", enum(provDesc+": the offer's provider, with instance_id (not with spec)", provs...)),
				optional("instance_id", str("the offer id from list_gpu_instances (its instance_id field); "+
					"omit to rent by spec", 200)),
				optional("spec", specSchema(provs)),
				required("image", str("container image, e.g. vllm/vllm-openai:latest", 500)),
				optional("label", str("your label for the instance", 200)),
				optional("hours", integer("rental duration in hours, with instance_id: required for io.net, which "+
					"charges it up front; ignored by vast.ai (with spec, use spec.hours)", 1, 720)),
				optional("env", stringMap("environment variables for the container", 50, 4096)),
				optional("ports", &jsonschema.Schema{Type: "array", Description: "container ports to expose, e.g. [8000]",
					MaxItems: jsonschema.Ptr(10), Items: integer("a port", 1, 65535)}),
				optional("image_login", &jsonschema.Schema{Type: "string", Description: "a private image's registry login, " +
					"\"-u USER -p TOKEN [REGISTRY]\" (as vast.ai's image_login and docker login take it; io.net uses the " +
					"user and token). A credential: passed to the provider, never stored, logged or shown; " +
					fleet.PassRules.Rule("image_login").Range()}),
				optional("onstart", ruleSchema(fleet.PassRules, "onstart", "a shell script the instance runs when it "+
					"starts (vast.ai; io.net runs none and refuses it, and a spec with it rents on vast.ai only)")),
				optional("args", ruleSchema(fleet.PassRules, "args", "the image's entrypoint arguments, e.g. "+
					`["--model", "meta-llama/Llama-3.1-8B-Instruct"]`)),
				optional("idempotency_key", str("a key of your choice: repeating a create with it returns the same instance "+
					"(or the same error), never a second rental", 200)),
				optional("confirm_token", str("the confirm_token of a confirmation_required answer, once a person has agreed", 200))},
				lifetimeFields()...)...),
			OutputSchema: outputSchema[instanceOutput](),
			Annotations: &sdk.ToolAnnotations{Title: "Rent a GPU instance", DestructiveHint: boolPtr(false),
				OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeInstancesWrite, s.createInstance),
		newTool(s, &sdk.Tool{
			Name:  "destroy_gpu_instance",
			Title: "Destroy a GPU instance",
			Description: "Destroy one of your instances (by our id or the provider's) and stop its billing. " +
				"Destroying an instance that is already gone succeeds.",
			InputSchema: object(
				optional("provider", enum(provDesc+" (checked against the instance when given)", provs...)),
				required("instance_id", str("the instance's id (gpi_…) or the provider's instance id", 200)),
			),
			OutputSchema: outputSchema[instanceOutput](),
			Annotations: &sdk.ToolAnnotations{Title: "Destroy a GPU instance", DestructiveHint: boolPtr(true),
				IdempotentHint: true, OpenWorldHint: boolPtr(true)},
		}, gpuproxy.ScopeInstancesWrite, s.destroyInstance),
		newTool(s, &sdk.Tool{
			Name:  "list_my_instances",
			Title: "Your GPU instances",
			Description: "List your instances, newest first, with status, endpoint (for proxy_inference_request), " +
				"cost to date in US dollars and lifetime: the rules, last_activity_at, idle_for, and when which rule " +
				"acts next (acts_at, rule, action). Create attempts that rented nothing (an offer gone, a provider refusal) " +
				"are not listed: a rent by spec shows them as the attempts of the instance it rented; status failed lists them.",
			InputSchema:  object(optional("status", enum("only instances in this status", statuses...))),
			OutputSchema: outputSchema[instancesOutput](),
			Annotations:  readOnly("Your GPU instances", false),
		}, gpuproxy.ScopeInstancesRead, s.listMine),
	}, s.lifetimeTools()...)
}

// offersOutput is one page of offers, as REST's GET /api/v1/gpu/offers.
type offersOutput struct {
	Offers     []offerJSON     `json:"offers" jsonschema:"offers, cheapest first"`
	Errors     []providerError `json:"errors" jsonschema:"providers that could not be searched; the others still answered"`
	NextCursor *string         `json:"next_cursor" jsonschema:"pass as cursor for the next page; null on the last page"`
}

// offerJSON is REST's offer plus instance_id, the name create_gpu_instance
// gives the offer id.
type offerJSON struct {
	InstanceID string `json:"instance_id" jsonschema:"pass to create_gpu_instance as instance_id"`
	apiview.OfferJSON
}

type providerError struct {
	Provider string `json:"provider"`
	Message  string `json:"message"`
}

type offersInput struct {
	Provider string      `json:"provider"`
	MinVRAM  float64     `json:"min_vram"`
	MaxPrice json.Number `json:"max_price"`
	GPUName  string      `json:"gpu_name"`
	MinGPUs  int         `json:"min_gpus"`
	Limit    int         `json:"limit"`
	Cursor   string      `json:"cursor"`
}

func (s *Server) listOffers(ctx context.Context, _ call, in offersInput) (result, error) {
	out, err := s.offers(ctx, in)
	if err != nil {
		return result{}, err
	}
	return result{offersText(out), out}, nil
}

// offers pages through the fleet's merged, cheapest-first search; the
// cursor is an offset into it (the fleet caches answers briefly, so pages
// are consistent while the cache lasts).
func (s *Server) offers(ctx context.Context, in offersInput) (offersOutput, error) {
	if len(s.svc.Fleet.ProviderNames()) == 0 {
		// Not "no offers match": there is nothing to search.
		return offersOutput{}, gpuproxy.Errorf(gpuproxy.EUNAVAILABLE, "no GPU provider is configured on this "+
			"gpuproxy, so there are no offers to list; its operator must set VASTAI_API_KEY and/or IONET_API_KEY "+
			"(or providers: in the config file) and restart it")
	}
	if in.Limit == 0 {
		in.Limit = 20
	}
	offset := 0
	if in.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(in.Cursor)
		n, cerr := strconv.Atoi(strings.TrimPrefix(string(b), "offers:"))
		if err != nil || cerr != nil || !strings.HasPrefix(string(b), "offers:") || n < 0 || n > 500 {
			return offersOutput{}, gpuproxy.Invalid("cursor", "is not a next_cursor returned by list_gpu_instances")
		}
		offset = n
	}
	q := fleet.OfferQuery{Provider: in.Provider, MinVRAM: in.MinVRAM, GPUName: in.GPUName, MinGPUs: in.MinGPUs,
		Limit: min(offset+in.Limit+1, 500)}
	if in.MaxPrice != "" {
		p, err := gpuproxy.ParseUSD(in.MaxPrice.String())
		if err != nil {
			return offersOutput{}, gpuproxy.InvalidUSD("max_price", err, 0, gpuproxy.MaxMicros, "a number of USD per hour")
		}
		q.MaxPrice = p
	}
	res, err := s.svc.Fleet.Offers(ctx, q)
	if err != nil {
		return offersOutput{}, err
	}
	out := offersOutput{Offers: []offerJSON{}, Errors: []providerError{}}
	for i := offset; i < len(res.Offers) && i < offset+in.Limit; i++ {
		o := apiview.NewOfferJSON(res.Offers[i])
		out.Offers = append(out.Offers, offerJSON{InstanceID: o.OfferID, OfferJSON: o})
	}
	if len(res.Offers) > offset+in.Limit {
		next := base64.RawURLEncoding.EncodeToString([]byte("offers:" + strconv.Itoa(offset+in.Limit)))
		out.NextCursor = &next
	}
	for _, e := range res.Errors {
		out.Errors = append(out.Errors, providerError{Provider: e.Provider, Message: e.Message})
	}
	return out, nil
}

// instanceOutput is one instance, as REST shows it, with a sentence on what
// happened and what to do next.
type instanceOutput struct {
	apiview.InstanceJSON
	Message string `json:"message" jsonschema:"what happened and what to do next"`
}

type instancesOutput struct {
	Instances []apiview.InstanceJSON `json:"instances" jsonschema:"your instances, newest first"`
}

type createInput struct {
	Provider       string            `json:"provider"`
	InstanceID     string            `json:"instance_id"`
	Image          string            `json:"image"`
	Label          string            `json:"label"`
	Hours          int               `json:"hours"`
	Env            map[string]string `json:"env"`
	Ports          []int             `json:"ports"`
	ImageLogin     string            `json:"image_login"`
	Onstart        string            `json:"onstart"`
	Args           []string          `json:"args"`
	IdempotencyKey string            `json:"idempotency_key"`
	ConfirmToken   string            `json:"confirm_token"`
	Spec           *specInput        `json:"spec"`
	lifetimeInput
}

// confirmSchema is the elicitation form: accepting it (with confirm left
// true) confirms the rental.
var confirmSchema = &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{
	"confirm": {Type: "boolean", Title: "Rent it", Description: "Rent this GPU at this price", Default: json.RawMessage("true")},
}}

// inputRequired is a tool's answer that asks the client for input (an
// elicitation) and to call again; newTool returns its result as it is.
type inputRequired struct{ res *sdk.CallToolResult }

func (e *inputRequired) Error() string { return "input required" }

// elicits reports whether the client declared the elicitation capability.
func elicits(c call) bool {
	if c.req == nil || c.req.Session == nil {
		return false
	}
	ip := c.req.Session.InitializeParams()
	return ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil
}

// confirmInput turns a confirmation_required refusal into an elicitation
// (elicitation/create: offer, GPU, price/hour, admitted cost; accept or
// decline) for a client that declared the capability, with the refusal's
// single-use confirm token as the request state: the SDK asks the person
// (directly for clients before multi-round-trip requests) and calls the
// tool again with the answer, and an accepted answer redeems the token.
// Other clients get the refusal, token included.
func confirmInput(c call, err error) error {
	d := gpuproxy.ErrorDetails(err)
	tok, _ := d["confirm_token"].(string)
	q, _ := d["question"].(string)
	if gpuproxy.ErrorCode(err) != gpuproxy.ECONFIRM || tok == "" || !elicits(c) {
		return err
	}
	return &inputRequired{res: &sdk.CallToolResult{
		InputRequests: sdk.InputRequestMap{"confirm": &sdk.ElicitParams{Mode: "form", Message: q, RequestedSchema: confirmSchema}},
		RequestState:  tok,
	}}
}

// confirmAnswer reads the person's answer of a retried call: the token to
// redeem when they accepted, a refusal when they declined.
func confirmAnswer(c call) (token string, err error) {
	if c.req == nil || c.req.Params == nil || c.req.Params.InputResponses == nil {
		return "", nil
	}
	r, ok := c.req.Params.InputResponses["confirm"].(*sdk.ElicitResult)
	if !ok {
		return "", nil
	}
	if r.Action != "accept" || r.Content["confirm"] == false {
		return "", gpuproxy.Errorf(gpuproxy.EFORBIDDEN, "the person declined the rental; nothing was rented")
	}
	return c.req.Params.RequestState, nil
}

func (s *Server) createInstance(ctx context.Context, c call, in createInput) (result, error) {
	acct := c.p.AccountID
	token, err := confirmAnswer(c)
	if err != nil {
		return result{}, err
	}
	if token == "" {
		token = in.ConfirmToken
	}
	if err := checkForm(in); err != nil {
		return result{}, err
	}
	if err := checkArgs(c, fleet.CreateRules); err != nil {
		return result{}, err
	}
	req := fleet.CreateRequest{Provider: in.Provider, OfferID: in.InstanceID,
		Image: in.Image, Label: in.Label, Hours: in.Hours, Env: in.Env, Ports: in.Ports,
		ImageLogin: in.ImageLogin, Onstart: in.Onstart, Args: in.Args,
		IdempotencyKey: in.IdempotencyKey, KeyID: c.p.KeyID, ConfirmToken: token}
	if req.Lifetime, err = in.request(); err != nil {
		return result{}, err
	}
	if in.Spec != nil {
		sp, err := in.Spec.spec()
		if err != nil {
			return result{}, err
		}
		req.Spec = &sp
	}
	inst, err := s.svc.Fleet.Create(ctx, acct, req)
	if err != nil {
		return result{}, confirmInput(c, renameOfferField(err))
	}
	s.changed(ctx, acct)
	if inst.Status == gpuproxy.Starting {
		progress := s.progressFunc(ctx, c.req)
		progress(fmt.Sprintf("rented %s on %s as %s; waiting for it to start", inst.GPUName, inst.Provider, inst.ID), 0, 0)
		wctx, cancel := context.WithTimeout(ctx, s.opts.StartWait)
		if got, err := s.svc.Fleet.WaitRunning(wctx, acct, inst.ID, progress); err == nil {
			inst = got
		}
		cancel()
		s.changed(ctx, acct)
	}
	if inst.Status == gpuproxy.Failed {
		next := "Pick another offer with list_gpu_instances and try again."
		if in.Spec != nil {
			next = "Call again with the same spec (and a new idempotency_key) to rent another offer."
		}
		return result{}, &gpuproxy.Error{Code: gpuproxy.EPROVIDER, Message: fmt.Sprintf(
			"instance %s did not start (%s); its hold was released and nothing more is charged. %s",
			inst.ID, inst.Error, next)}
	}
	v, err := s.svc.Fleet.Get(ctx, acct, inst.ID)
	if err != nil {
		v = fleet.View{Instance: inst}
	}
	out := instanceOutput{InstanceJSON: apiview.NewInstanceJSON(v)}
	switch v.Status {
	case gpuproxy.Running:
		out.Message = fmt.Sprintf("Instance %s is running at %s. Call it with proxy_inference_request "+
			"(target_url under that endpoint) and destroy it with destroy_gpu_instance when done.", v.ID, v.Endpoint)
	case gpuproxy.Pending:
		out.Message = fmt.Sprintf("The provider did not confirm the rental of %s yet; it is being reconciled. "+
			"Check list_my_instances in a minute.", v.ID)
	default:
		out.Message = fmt.Sprintf("Instance %s is %s. Check list_my_instances until it is running.", v.ID, v.Status)
	}
	if sum := attemptsSummary(out.Attempts); sum != "" {
		out.Message = sum + " " + out.Message
	}
	return result{instanceText("Created", out), out}, nil
}

// renameOfferField speaks the tool's language: the fleet calls the offer id
// offer_id, create_gpu_instance calls it instance_id.
func renameOfferField(err error) error {
	var e *gpuproxy.Error
	if errors.As(err, &e) && e.Code == gpuproxy.EINVALID && e.Details["field"] == "offer_id" {
		return gpuproxy.Invalid("instance_id", "is required: an offer's instance_id from list_gpu_instances")
	}
	return err
}

// progressFunc reports fleet progress as MCP progress notifications when
// the client sent a progress token; otherwise it does nothing. Progress
// always increases, as the spec requires.
func (s *Server) progressFunc(ctx context.Context, req *sdk.CallToolRequest) fleet.Progress {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return func(string, float64, float64) {}
	}
	last := -1.0
	return func(msg string, done, total float64) {
		if done <= last {
			done = last + 0.001
		}
		last = done
		if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: tok,
			Message: msg, Progress: done, Total: total}); err != nil {
			s.log.Debug("progress notification not delivered", "err", err)
		}
	}
}

type destroyInput struct {
	Provider   string `json:"provider"`
	InstanceID string `json:"instance_id"`
}

func (s *Server) destroyInstance(ctx context.Context, c call, in destroyInput) (result, error) {
	acct := c.p.AccountID
	v, err := s.svc.Fleet.Get(ctx, acct, in.InstanceID)
	if err != nil {
		return result{}, err
	}
	if in.Provider != "" && in.Provider != v.Provider {
		return result{}, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "you have no %s instance %q", in.Provider, in.InstanceID)
	}
	inst, err := s.svc.Fleet.Destroy(ctx, acct, v.ID)
	if err != nil {
		return result{}, err
	}
	s.changed(ctx, acct)
	if v, err = s.svc.Fleet.Get(ctx, acct, inst.ID); err != nil {
		v = fleet.View{Instance: inst}
	}
	gone := v.Status == gpuproxy.Terminated || v.Status == gpuproxy.Failed
	if gone {
		// Its final cost, the metered time up to the stop included, not
		// only what the ledger has charged so far.
		if c, err := s.svc.Fleet.FinalCost(ctx, v.Instance); err == nil {
			v.CostToDate = c
		}
	}
	out := instanceOutput{InstanceJSON: apiview.NewInstanceJSON(v)}
	if gone {
		out.Message = fmt.Sprintf("Instance %s is gone; billing stopped. Final cost: $%s.", v.ID, v.CostToDate)
	} else {
		out.Message = fmt.Sprintf("The provider accepted the destroy of %s; it is %s until the provider confirms "+
			"(billing stops at the termination time).", v.ID, v.Status)
	}
	return result{instanceText("Destroyed", out), out}, nil
}

type listMineInput struct {
	Status string `json:"status"`
}

func (s *Server) listMine(ctx context.Context, c call, in listMineInput) (result, error) {
	out, err := s.mine(ctx, c.p, in.Status)
	if err != nil {
		return result{}, err
	}
	return result{instancesText(out), out}, nil
}

func (s *Server) mine(ctx context.Context, p gpuproxy.Principal, status string) (instancesOutput, error) {
	vs, err := s.svc.Fleet.List(ctx, p.AccountID, status)
	if err != nil {
		return instancesOutput{}, err
	}
	out := instancesOutput{Instances: make([]apiview.InstanceJSON, 0, len(vs))}
	for _, v := range vs {
		out.Instances = append(out.Instances, apiview.NewInstanceJSON(v))
	}
	return out, nil
}
