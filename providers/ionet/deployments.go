package ionet

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// DefaultTrafficPort is the container port io.net routes public_url to
// when the request names none.
const DefaultTrafficPort = 8000

// maxPort is the largest TCP port.
const maxPort = 65535

// Create deploys one container of the offer's hardware, location and GPUs
// for req.Hours prepaid hours (DefaultHours when ≤ 0), tagged with req.Tag as
// resource_private_name. io.net routes a single HTTP traffic port, so at most
// one port may be given (default DefaultTrafficPort). Env entries whose names
// look secret (TOKEN, SECRET, PASSWORD, KEY) go to secret_env_variables, which
// io.net never echoes back. DiskGB is ignored: CaaS has no disk setting.
//
// The call is never retried. A 5xx, an unreadable 2xx or a transport failure
// is KindAmbiguous: the deployment may exist, and List finds it by tag.
func (a *Adapter) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	o := op{name: "creating deployment", unsafe: true, gone404: true}
	invalid := func(msg string) error {
		return &providers.Error{Provider: providers.IONet, Kind: providers.KindInvalid, Message: o.name + ": " + msg}
	}
	id, err := parseOfferID(req.OfferID)
	if err != nil {
		return providers.Instance{}, badOfferID(err)
	}
	if strings.TrimSpace(req.Tag) == "" {
		return providers.Instance{}, invalid("a tag (resource_private_name) is required")
	}
	if err := a.CheckCreate(req); err != nil {
		return providers.Instance{}, err
	}
	hours := req.Hours
	if hours <= 0 {
		hours = a.hours
	}
	port := DefaultTrafficPort
	if len(req.Ports) == 1 {
		port = req.Ports[0]
	}
	body := deployRequest{
		ResourcePrivateName: req.Tag,
		DurationHours:       hours,
		GPUsPerContainer:    id.GPUs,
		HardwareID:          id.Hardware,
		LocationIDs:         []int{id.Location},
		ContainerConfig:     containerConfig{ReplicaCount: 1, TrafficPort: port},
		RegistryConfig:      registryConfig{ImageURL: req.Image},
	}
	if len(req.Args) > 0 {
		body.ContainerConfig.Args = req.Args
	}
	if req.ImageLogin != "" {
		// Checked by CheckCreate. io.net takes the registry from the
		// image's own name, so the login's host is not sent.
		l, _ := providers.ParseImageLogin(req.ImageLogin)
		body.RegistryConfig.Username, body.RegistryConfig.Secret = &l.User, &l.Secret
	}
	for k, v := range req.Env {
		m := &body.ContainerConfig.EnvVariables
		if looksSecret(k) {
			m = &body.ContainerConfig.SecretEnvVariables
		}
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[k] = v
	}
	r, err := a.c.Do(ctx, providers.Call{Method: http.MethodPost, Path: caas + "/deploy", Body: body})
	if err != nil {
		return providers.Instance{}, a.wrapErr(o, err)
	}
	if r.Status/100 != 2 {
		return providers.Instance{}, a.httpError(o, r)
	}
	var rep actionReply
	if err := json.Unmarshal(r.Body, &rep); err != nil || rep.DeploymentID == "" {
		if err == nil {
			err = fmt.Errorf("no deployment_id")
		}
		return providers.Instance{}, a.decodeErr(o, err)
	}
	return providers.Instance{
		ProviderID: rep.DeploymentID,
		Tag:        req.Tag,
		Status:     providers.StatusStarting,
		GPUName:    a.hardwareName(ctx, id.Hardware),
		NumGPUs:    id.GPUs,
	}, nil
}

// CheckCreate checks what a create would send besides the offer. io.net
// routes a single traffic port; it takes entrypoint arguments
// (container_config.args) and a registry login (registry_username and
// registry_secret, read from image_login's "-u USER -p TOKEN"), but runs
// no start script: an onstart is refused naming the field, since
// io.net's containers run only the image's entrypoint (its command
// would replace that entrypoint, not run after it).
func (a *Adapter) CheckCreate(req providers.CreateRequest) error {
	invalid := func(field, msg string) error {
		return &providers.Error{Provider: providers.IONet, Kind: providers.KindInvalid, Field: field,
			Message: "creating deployment: " + msg}
	}
	switch {
	case strings.TrimSpace(req.Image) == "":
		return invalid("image", "an image is required")
	case len(req.Ports) > 1:
		return invalid("ports", fmt.Sprintf("io.net routes a single traffic port, got %d ports", len(req.Ports)))
	case len(req.Ports) == 1 && (req.Ports[0] < 1 || req.Ports[0] > maxPort):
		// io.net's schema does not bound traffic_port: check it here.
		return invalid("ports", fmt.Sprintf("the traffic port must be between 1 and %d, got %d", maxPort, req.Ports[0]))
	case req.Onstart != "":
		return invalid("onstart", "io.net runs no start script: its containers run the image's entrypoint "+
			"(with args); leave onstart out, or rent on vast.ai")
	}
	if req.ImageLogin != "" {
		if _, err := providers.ParseImageLogin(req.ImageLogin); err != nil {
			return invalid("image_login", err.Error())
		}
	}
	return nil
}

// looksSecret reports env names that should not be echoed by io.net.
func looksSecret(name string) bool {
	n := strings.ToUpper(name)
	for _, w := range []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Get returns a deployment from its details and, once running, its
// containers: Endpoint is the first worker's public_url, normalized. A
// deployment io.net reports as running is StatusStarting until a public_url
// appears (io.net publishes it after the health check passes).
// ActualCost is amount_paid: the gross prepaid amount, before any
// early-destroy refund (see Refund). While the deployment is live,
// PricePerHour is derived from it over the paid duration. An unknown or
// destroyed deployment is KindGone; for a destroyed one the Instance is
// returned too, with its last known values.
// io.net's details carry no name, so Tag is "" unless the reply has one.
// GPUName is brand and hardware name ("NVIDIA A100-SXM4-80GB"), as offers
// show it.
func (a *Adapter) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	o := op{name: "getting deployment " + providerID, gone404: true}
	if strings.TrimSpace(providerID) == "" {
		return providers.Instance{}, &providers.Error{Provider: providers.IONet, Kind: providers.KindNotFound,
			Message: "getting deployment: empty id"}
	}
	path := caas + "/deployment/" + url.PathEscape(providerID)
	var d wireDeployment
	if err := a.get(ctx, o, path, nil, &d); err != nil {
		return providers.Instance{}, err
	}
	if d.ID == "" {
		d.ID = providerID
	}
	inst := toInstance(d)
	if isDestroyed(d.Status) {
		return inst, &providers.Error{Provider: providers.IONet, Kind: providers.KindGone, Status: http.StatusOK,
			Message: o.name + ": deployment is " + d.Status}
	}
	if inst.Status != providers.StatusRunning {
		return inst, nil
	}
	var w wireWorkerList
	q := url.Values{"page": {"0"}, "page_size": {"100"}}
	if err := a.get(ctx, op{name: "listing containers of " + providerID, gone404: true}, path+"/containers", q, &w); err != nil {
		return providers.Instance{}, err
	}
	for _, wk := range w.Workers {
		if wk.PublicURL == nil {
			continue
		}
		if ep := normalizeEndpoint(*wk.PublicURL); ep != "" {
			inst.Endpoint = ep
			break
		}
	}
	if inst.Endpoint == "" {
		inst.Status = providers.StatusStarting
	}
	return inst, nil
}

// toInstance maps details or a list item.
func toInstance(d wireDeployment) providers.Instance {
	inst := providers.Instance{
		ProviderID: d.ID,
		Tag:        d.ResourcePrivateName,
		Status:     mapStatus(d.Status),
		GPUName:    strings.TrimSpace(d.BrandName + " " + d.HardwareName),
		StartedAt:  d.StartedAt.Time,
		StoppedAt:  d.FinishedAt.Time,
	}
	if inst.Tag == "" {
		inst.Tag = d.Name
	}
	if inst.StartedAt.IsZero() {
		inst.StartedAt = d.CreatedAt.Time
	}
	switch {
	case d.TotalGPUs > 0:
		inst.NumGPUs = d.TotalGPUs
	case d.GPUsPerContainer > 0:
		inst.NumGPUs = d.GPUsPerContainer * max(d.TotalContainers, 1)
	default:
		inst.NumGPUs = d.HardwareQuantity
	}
	if d.AmountPaid.set {
		inst.ActualCost, inst.HasActualCost = d.AmountPaid.v, true
		// Served + remaining minutes is the paid duration only while the
		// deployment is live; afterwards remaining drops to zero.
		live := inst.Status == providers.StatusStarting || inst.Status == providers.StatusRunning
		if mins := math.Round(d.ComputeMinutesServed + d.ComputeMinutesRemaining); live && mins > 0 {
			inst.PricePerHour = gpuproxy.Micros(math.Round(float64(d.AmountPaid.v) * 60 / mins))
		}
	}
	return inst
}

// List returns every deployment of the account, walking all pages of the
// zero-based deployment list. Tag is the deployment's name, which is the
// resource_private_name we set. Destroyed deployments are included as
// StatusTerminated. List items carry no price or times.
func (a *Adapter) List(ctx context.Context) ([]providers.Instance, error) {
	var out []providers.Instance
	seen := map[string]bool{}
	for page := 0; ; page++ {
		var l wireDeploymentList
		q := url.Values{"page": {strconv.Itoa(page)}, "page_size": {strconv.Itoa(a.pageSize)}}
		if err := a.get(ctx, op{name: fmt.Sprintf("listing deployments (page %d)", page)}, caas+"/deployments", q, &l); err != nil {
			return nil, err
		}
		for _, d := range l.Deployments {
			// Pages shift when deployments are created meanwhile.
			if d.ID == "" || seen[d.ID] {
				continue
			}
			seen[d.ID] = true
			out = append(out, toInstance(d))
		}
		last := len(l.Deployments) < a.pageSize || (page+1)*a.pageSize >= l.Total
		if last || page >= 10_000 {
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ProviderID < out[j].ProviderID })
	return out, nil
}

// Destroy deletes a deployment. One that is already destroyed, completed or
// unknown (404, 410) counts as destroyed. The call is safe to retry.
func (a *Adapter) Destroy(ctx context.Context, providerID string) error {
	o := op{name: "destroying deployment " + providerID}
	if strings.TrimSpace(providerID) == "" {
		return &providers.Error{Provider: providers.IONet, Kind: providers.KindNotFound,
			Message: "destroying deployment: empty id"}
	}
	r, err := a.c.Do(ctx, providers.Call{Method: http.MethodDelete,
		Path: caas + "/deployment/" + url.PathEscape(providerID), Safe: true})
	if err != nil {
		return a.wrapErr(o, err)
	}
	switch {
	case r.Status/100 == 2, r.Status == http.StatusNotFound, r.Status == http.StatusGone:
		return nil
	case r.Status == http.StatusBadRequest || r.Status == http.StatusConflict:
		m := strings.ToLower(detailMessage(r.Body))
		if strings.Contains(m, "destroyed") || strings.Contains(m, "terminat") || strings.Contains(m, "completed") {
			return nil
		}
	}
	return a.httpError(o, r)
}
