package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// servicesTimeout bounds one services call (none rents: the server's
// controller does, after the answer).
const servicesTimeout = time.Minute

// maxDefinitionFile bounds a -f FILE (the server's body limit is larger).
const maxDefinitionFile = 1 << 20

// servicesUsage is the overview's entries for `services`.
const servicesUsage = `  services create (-f FILE | --name NAME --model MODEL --image IMAGE --port N --max-price USD)
                  [--gpu NAME]… [--min N] [--max N] [--placement P] [--json]
                                              define a service through the running server as
                                              GPUPROXY_API_KEY (--url, GPUPROXY_URL): one OpenAI-
                                              compatible endpoint for MODEL over replicas rented by
                                              spec; FILE is its definition as JSON (- for stdin), the
                                              flags set its common fields over FILE's
  services list [--json]                      the account's services: state, ready/desired replicas
  services show NAME|ID [--json]              a service's settings, replicas and latest events
  services update NAME|ID [-f FILE] [--model M] [--gpu NAME]… [--max-price USD] [--image I] [--port N]
                  [--min N] [--max N] [--placement P] [--json]
                                              change a service: FILE's fields and the flags, merged
                                              over its definition (the name cannot change)
  services events NAME|ID [--limit N] [--json]
                                              a service's history, newest first (default 50)
  services delete NAME|ID [--json]            stop taking requests, drain and destroy its replicas`

// serviceFlagOf is each definition field a flag sets: an API error about
// the field names the flag.
var serviceFlagOf = map[string]string{
	"name": "--name", "model": "--model", "image": "--image", "port": "--port", "spec.gpu": "--gpu",
	"spec.max_price_per_hour": "--max-price", "replicas.min": "--min", "replicas.max": "--max",
	"placement": "--placement",
}

// serviceFields are the flags that set definition fields, by flag name.
var serviceFields = map[string]string{
	"name": "name", "model": "model", "image": "image", "port": "port", "gpu": "spec.gpu",
	"max-price": "spec.max_price_per_hour", "min": "replicas.min", "max": "replicas.max",
	"placement": "placement",
}

// serviceReply is the part of the API's service the CLI prints.
type serviceReply struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Name  string `json:"name"`
	Model string `json:"model"`
	Spec  struct {
		GPU             []string        `json:"gpu"`
		MinVRAMGB       float64         `json:"min_vram_gb"`
		NumGPUs         int             `json:"num_gpus"`
		MaxPricePerHour gpuproxy.Micros `json:"max_price_per_hour"`
		Providers       []string        `json:"providers"`
		Locations       []string        `json:"locations"`
		Billing         string          `json:"billing"`
	} `json:"spec"`
	Image     string            `json:"image"`
	Env       map[string]string `json:"env"`
	Port      int               `json:"port"`
	Readiness struct {
		Path         string `json:"path"`
		Timeout      string `json:"timeout"`
		InitialDelay string `json:"initial_delay"`
	} `json:"readiness"`
	Scale struct {
		TargetInflight int    `json:"target_inflight_per_replica"`
		UpDelay        string `json:"up_delay"`
		DownDelay      string `json:"down_delay"`
	} `json:"scale"`
	QueueTimeout string `json:"queue_timeout"`
	Lifetime     struct {
		IdleTimeout string `json:"idle_timeout"`
		MaxDuration string `json:"max_duration"`
	} `json:"lifetime"`
	Placement      string                 `json:"placement"`
	Overprovision  int                    `json:"overprovision"`
	PreemptedGrace string                 `json:"preempted_grace"`
	BaseURL        string                 `json:"base_url"`
	Desired        int                    `json:"desired_replicas"`
	Ready          int                    `json:"ready_replicas"`
	Bounds         struct{ Min, Max int } `json:"replicas"`
	Replicas       []serviceReplicaRow    `json:"instances"`
	Events         []serviceEventRow      `json:"events"`
}

// serviceReplicaRow is one replica of a service.
type serviceReplicaRow struct {
	InstanceID   string          `json:"instance_id"`
	State        string          `json:"state"`
	Instance     string          `json:"instance_status"`
	Market       string          `json:"market"`
	Provider     string          `json:"provider"`
	GPUName      string          `json:"gpu_name"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	ReadyAt      *time.Time      `json:"ready_at"`
	Reason       string          `json:"reason"`
}

// serviceEventRow is one event of a service's history.
type serviceEventRow struct {
	Kind       string    `json:"kind"`
	InstanceID string    `json:"instance_id"`
	Message    string    `json:"message"`
	At         time.Time `json:"at"`
}

// serviceFlags are the flags of `services`.
type serviceFlags struct {
	file, name, model, image, maxPrice, placement *string
	port, min, max, limit                         *int
	gpus                                          *listFlag
	asJSON                                        *bool
}

// cmdServices is `gpuproxy services create|list|show|update|events|delete`:
// a client of a running gpuproxy's REST API (/api/v1/services), acting as
// the key in GPUPROXY_API_KEY.
func cmdServices(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	f := newFlags("services")
	urlFlag := f.String("url", "", "the gpuproxy to call (default GPUPROXY_URL, else the running sandbox, else "+DefaultServerURL+")")
	var gpus listFlag
	sf := serviceFlags{
		file:     f.String("f", "", "the service's definition as JSON (as POST /api/v1/services takes it; - for stdin); for update, the fields to change"),
		name:     f.String("name", "", "the service's name: 1-63 characters of a-z, 0-9, '.', '_' and '-'"),
		model:    f.String("model", "", "the model name clients send, e.g. meta-llama/Llama-3.1-8B-Instruct"),
		image:    f.String("image", "", "the replicas' container image, serving an OpenAI-compatible API on --port"),
		maxPrice: f.String("max-price", "", "the most you accept per replica, USD per hour"),
		placement: f.String("placement", "", "the replicas' market: on-demand (default), interruptible or "+
			"interruptible-with-fallback"),
		port:   f.Int("port", 0, "the replica's OpenAI-compatible server port, e.g. 8000"),
		min:    f.Int("min", 0, "replicas kept ready (0: scale to zero; default 1)"),
		max:    f.Int("max", 0, "the most replicas load scales to (default --min)"),
		limit:  f.Int("limit", 0, "events to list, 1 to 500 (default 50)"),
		gpus:   &gpus,
		asJSON: f.Bool("json", false, "print the API's answer as JSON"),
	}
	f.Var(&gpus, "gpu", "acceptable GPU names (substrings, e.g. 4090), repeatable or a comma list")
	f.forSub("create update", "f", "model", "image", "max-price", "port", "min", "max", "gpu", "placement")
	f.forSub("create", "name")
	f.forSub("events", "limit")
	if err := f.parse(args); err != nil {
		return err
	}
	set := setFlags(f)
	if len(f.args) == 0 {
		return errors.New("usage: gpuproxy services create|list|show|update|events|delete …; gpuproxy services --help lists them")
	}
	sub := f.args[0]
	if len(usageLines("services "+sub)) == 0 {
		return fmt.Errorf("services %s: no such subcommand: use create, list, show, update, events or delete", sub)
	}
	for name := range set {
		if subs, limited := f.only[name]; limited && !slices.Contains(subs, sub) {
			return fmt.Errorf("--%s: not a flag of services %s (gpuproxy services %s --help lists them)", name, sub, sub)
		}
	}
	switch {
	case (sub == "create" || sub == "list") && len(f.args) != 1:
		return fmt.Errorf("usage: gpuproxy services %s takes no argument (got %q)", sub, strings.Join(f.args[1:], " "))
	case sub != "create" && sub != "list" && (len(f.args) != 2 || f.args[1] == ""):
		return fmt.Errorf("usage: gpuproxy services %s NAME|ID", sub)
	}
	srv, err := apiTarget(*urlFlag, getenv)
	if err != nil {
		return err
	}
	c := servicesClient{apiServer: srv, stdout: stdout, json: *sf.asJSON}
	var path string
	if len(f.args) == 2 {
		path = "/api/v1/services/" + url.PathEscape(f.args[1])
	}
	switch sub {
	case "create":
		body, names, err := sf.definition(set, stdin, true)
		if err != nil {
			return err
		}
		v, err := c.call(ctx, http.MethodPost, "/api/v1/services", body, names)
		if err != nil {
			return err
		}
		return c.printChange(v, "created", fmt.Sprintf("its replicas are rented next: gpuproxy services show %s follows them", v.Name))
	case "update":
		body, names, err := sf.definition(set, stdin, false)
		if err != nil {
			return err
		}
		v, err := c.call(ctx, http.MethodPatch, path, body, names)
		if err != nil {
			return err
		}
		return c.printChange(v, "updated", "")
	case "delete":
		v, err := c.call(ctx, http.MethodDelete, path, nil, nil)
		if err != nil {
			return err
		}
		return c.printChange(v, "deleting", fmt.Sprintf("it takes no new requests; its %d replica(s) drain, then are destroyed", len(v.Replicas)))
	case "show":
		v, err := c.call(ctx, http.MethodGet, path, nil, nil)
		if err != nil || c.json {
			return err
		}
		return c.printService(v)
	case "list":
		return c.list(ctx)
	}
	// events
	q := ""
	if set["limit"] {
		q = "?limit=" + strconv.Itoa(*sf.limit)
	}
	return c.events(ctx, path+"/events"+q)
}

// servicesClient calls the services routes of one gpuproxy as one key.
type servicesClient struct {
	apiServer
	stdout io.Writer
	json   bool // print the answers as JSON
}

// call sends one request about a service (body nil: none) and decodes
// the service; with --json it prints the answer as it is first. An API
// error names the CLI's flags (names: field → flag).
func (c servicesClient) call(ctx context.Context, method, path string, body any, names map[string]string) (serviceReply, error) {
	raw, err := c.do(ctx, method, path, body, names)
	if err != nil {
		return serviceReply{}, err
	}
	var v serviceReply
	if err := json.Unmarshal(raw, &v); err != nil || v.ID == "" {
		return serviceReply{}, fmt.Errorf("%s %s: an answer that is not a service: %.200s", method, c.base+path, raw)
	}
	if c.json {
		return v, c.printJSON(raw)
	}
	return v, nil
}

// do sends one request and returns the body of a 2xx answer, or the
// API's error as the CLI says it.
func (c servicesClient) do(ctx context.Context, method, path string, body any, names map[string]string) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, servicesTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("--url %s: %w", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-API-Key", c.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, c.unreachable(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s %s: %w", method, c.base+path, err)
	}
	if res.StatusCode/100 == 2 {
		return raw, nil
	}
	e, ok := apiError(raw)
	if !ok {
		return nil, fmt.Errorf("%s %s: HTTP %d: %.200s", method, c.base+path, res.StatusCode, raw)
	}
	return nil, argErr(e, names, nil)
}

// printJSON prints an answer indented.
func (c servicesClient) printJSON(raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := c.stdout.Write(b.Bytes())
	return err
}

// printChange prints what a create, update or delete did, then a note.
func (c servicesClient) printChange(v serviceReply, verb, note string) error {
	if c.json {
		return nil
	}
	fmt.Fprintf(c.stdout, "%s service %s (%s): model %s, %s, %d/%d replicas ready\n", verb, v.Name, v.ID, v.Model, v.State,
		v.Ready, v.Desired)
	fmt.Fprintf(c.stdout, "base_url: %s (clients send model %q)\n", c.base+v.BaseURL, v.Model)
	if note != "" {
		fmt.Fprintln(c.stdout, note)
	}
	return nil
}

// list prints the account's services as a table.
func (c servicesClient) list(ctx context.Context) error {
	raw, err := c.do(ctx, http.MethodGet, "/api/v1/services", nil, nil)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(raw)
	}
	var l struct {
		Services []serviceReply `json:"services"`
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return fmt.Errorf("GET %s/api/v1/services: an answer that is not a list of services: %.200s", c.base, raw)
	}
	rows := [][]any{{"NAME", "MODEL", "STATE", "READY", "MIN-MAX", "GPU", "MAX/H", "ID"}}
	baseURL := ""
	for _, v := range l.Services {
		rows = append(rows, []any{v.Name, v.Model, v.State, fmt.Sprintf("%d/%d", v.Ready, v.Desired),
			fmt.Sprintf("%d-%d", v.Bounds.Min, v.Bounds.Max), gpuText(v),
			v.Spec.MaxPricePerHour, v.ID})
		baseURL = v.BaseURL
	}
	if err := writeTable(c.stdout, rows); err != nil {
		return err
	}
	if len(l.Services) == 0 {
		fmt.Fprintln(c.stdout, "no services; gpuproxy services create defines one")
		return nil
	}
	fmt.Fprintf(c.stdout, "\nbase_url: %s (clients send the service's model)\n", c.base+baseURL)
	return nil
}

// printService prints one service: its settings, replicas and events.
func (c servicesClient) printService(v serviceReply) error {
	w := c.stdout
	fmt.Fprintf(w, "service %s (%s): %s, %d/%d replicas ready (%d to %d)\n", v.Name, v.ID, v.State, v.Ready, v.Desired,
		v.Bounds.Min, v.Bounds.Max)
	spec := gpuText(v) + ", at most " + usd(v.Spec.MaxPricePerHour) + "/h per replica"
	if v.Spec.NumGPUs > 1 {
		spec = fmt.Sprintf("%d× %s", v.Spec.NumGPUs, spec)
	}
	if v.Spec.MinVRAMGB > 0 {
		spec += fmt.Sprintf(", %s GB or more per GPU", strconv.FormatFloat(v.Spec.MinVRAMGB, 'f', -1, 64))
	}
	if len(v.Spec.Providers) > 0 {
		spec += ", on " + strings.Join(v.Spec.Providers, ", ")
	}
	if len(v.Spec.Locations) > 0 {
		spec += ", in " + strings.Join(v.Spec.Locations, ", ")
	}
	if v.Spec.Billing != "" {
		spec += ", " + v.Spec.Billing
	}
	env := make([]string, 0, len(v.Env))
	for k := range v.Env {
		env = append(env, k)
	}
	slices.Sort(env)
	lines := [][2]string{
		{"model", v.Model},
		{"base_url", c.base + v.BaseURL},
		{"spec", spec},
		{"image", fmt.Sprintf("%s, port %d", v.Image, v.Port)},
		{"readiness", fmt.Sprintf("GET %s within %s, first after %s", v.Readiness.Path, v.Readiness.Timeout, v.Readiness.InitialDelay)},
		{"scale", fmt.Sprintf("%d in flight per replica: up after %s above, down after %s under half", v.Scale.TargetInflight,
			v.Scale.UpDelay, v.Scale.DownDelay)},
		{"queue", "a request waits up to " + v.QueueTimeout + " for a ready replica"},
		{"lifetime", fmt.Sprintf("idle_timeout %s, max_duration %s", v.Lifetime.IdleTimeout, v.Lifetime.MaxDuration)},
		{"placement", placementText(v)},
	}
	if len(env) > 0 {
		lines = append(lines, [2]string{"env", strings.Join(env, ", ")})
	}
	for _, l := range lines {
		fmt.Fprintf(w, "%-10s %s\n", l[0]+":", l[1])
	}
	fmt.Fprintln(w)
	if len(v.Replicas) == 0 {
		fmt.Fprintln(w, "no replicas")
	} else {
		rows := [][]any{{"INSTANCE", "STATE", "STATUS", "MARKET", "PROVIDER", "GPU", "PRICE/H", "READY SINCE", "REASON"}}
		for _, r := range v.Replicas {
			ready := "-"
			if r.ReadyAt != nil {
				ready = r.ReadyAt.UTC().Format(time.DateTime)
			}
			rows = append(rows, []any{r.InstanceID, r.State, dash(r.Instance), dash(r.Market), dash(r.Provider), dash(r.GPUName),
				r.PricePerHour, ready, dash(r.Reason)})
		}
		if err := writeTable(w, rows); err != nil {
			return err
		}
	}
	if len(v.Events) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nlatest events:")
	return writeEvents(w, v.Events)
}

// placementText says where a service's replicas are rented.
func placementText(v serviceReply) string {
	switch v.Placement {
	case "", "on-demand":
		return "on-demand"
	}
	return fmt.Sprintf("%s, %d extra kept, a preempted one kept %s in case it resumes", v.Placement, v.Overprovision,
		v.PreemptedGrace)
}

// events prints a service's history.
func (c servicesClient) events(ctx context.Context, path string) error {
	raw, err := c.do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(raw)
	}
	var l struct {
		Events []serviceEventRow `json:"events"`
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return fmt.Errorf("GET %s: an answer that is not a list of events: %.200s", c.base+path, raw)
	}
	return writeEvents(c.stdout, l.Events)
}

// writeEvents writes events as a table, times in UTC.
func writeEvents(w io.Writer, evs []serviceEventRow) error {
	rows := [][]any{{"AT (UTC)", "KIND", "INSTANCE", "MESSAGE"}}
	for _, e := range evs {
		rows = append(rows, []any{e.At.UTC().Format(time.DateTime), e.Kind, dash(e.InstanceID), e.Message})
	}
	return writeTable(w, rows)
}

// gpuText is a service's acceptable GPUs.
func gpuText(v serviceReply) string {
	if len(v.Spec.GPU) == 0 {
		return "any GPU"
	}
	return strings.Join(v.Spec.GPU, ", ")
}

// dash is s, or "-" for a table's empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
