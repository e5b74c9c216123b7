package ionetsim

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// This file serves the read routes: the deployment list, details,
// containers and logs. Every reply is wrapped in {"data": ...}.

// Timestamps come back without a zone, as io.net's sometimes do; container
// timestamps carry one.
func zoneless(t time.Time, layout string) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(layout)
}

const (
	microLayout  = "2006-01-02T15:04:05.000000"
	secondLayout = "2006-01-02T15:04:05"
)

func withZ(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// minutes returns compute minutes served and remaining at now.
func (d *deployment) minutes(now time.Time) (served, remaining int) {
	total := d.hours * 60
	switch {
	case d.started.IsZero():
		return 0, total
	case !d.finished.IsZero():
		return min(int(d.finished.Sub(d.started).Minutes()), total), 0
	}
	served = min(int(now.Sub(d.started).Minutes()), total)
	return served, total - served
}

func percent(served, total int) float64 {
	if total <= 0 {
		return 0
	}
	return math.Round(float64(served)*10000/float64(total)) / 100
}

type locJSON struct {
	ID   int    `json:"id"`
	ISO2 string `json:"iso2"`
	Name string `json:"name"`
}

// containerConfigJSON is the details' ContainerConfig-Output: no args,
// command or registry settings, and secrets by name only.
type containerConfigJSON struct {
	Entrypoint    []string          `json:"entrypoint"`
	EnvVariables  map[string]string `json:"env_variables"`
	TrafficPort   int               `json:"traffic_port"`
	ImageURL      string            `json:"image_url"`
	SecretEnvKeys []string          `json:"secret_env_keys"`
}

type detailsJSON struct {
	ID                      string              `json:"id"`
	Status                  string              `json:"status"`
	CreatedAt               any                 `json:"created_at"`
	StartedAt               any                 `json:"started_at"`
	FinishedAt              any                 `json:"finished_at"`
	AmountPaid              gpuproxy.Micros     `json:"amount_paid"`
	CompletedPercent        float64             `json:"completed_percent"`
	TotalGPUs               int                 `json:"total_gpus"`
	GPUsPerContainer        int                 `json:"gpus_per_container"`
	TotalContainers         int                 `json:"total_containers"`
	HardwareName            string              `json:"hardware_name"`
	HardwareID              int                 `json:"hardware_id"`
	Locations               []locJSON           `json:"locations"`
	BrandName               string              `json:"brand_name"`
	ComputeMinutesServed    int                 `json:"compute_minutes_served"`
	ComputeMinutesRemaining int                 `json:"compute_minutes_remaining"`
	ContainerConfig         containerConfigJSON `json:"container_config"`
}

// detailsOf renders d as GET caas/deployment/{id} reports it: no name, no
// hourly price, amount_paid as the prepaid total. The caller holds s.mu.
func (s *Server) detailsOf(d *deployment) detailsJSON {
	served, remaining := d.minutes(s.opts.Now())
	env := map[string]string{}
	for k, v := range d.env {
		env[k] = v
	}
	return detailsJSON{
		ID: d.id, Status: d.status,
		CreatedAt:  zoneless(d.created, microLayout),
		StartedAt:  zoneless(d.started, secondLayout),
		FinishedAt: zoneless(d.finished, secondLayout),
		AmountPaid: d.paid, CompletedPercent: percent(served, d.hours*60),
		TotalGPUs: d.gpus * d.replicas, GPUsPerContainer: d.gpus, TotalContainers: d.replicas,
		HardwareName: d.hw.Name, HardwareID: d.hw.ID, BrandName: d.hw.Brand,
		Locations:            []locJSON{{ID: d.loc.LocationID, ISO2: d.loc.ISO2, Name: d.loc.Name}},
		ComputeMinutesServed: served, ComputeMinutesRemaining: remaining,
		ContainerConfig: containerConfigJSON{Entrypoint: d.entrypoint, EnvVariables: env, TrafficPort: d.port,
			ImageURL: d.image, SecretEnvKeys: d.secretKeys()},
	}
}

// details serves GET caas/deployment/{id}; destroyed deployments are still
// reported, with status "destroyed".
func (s *Server) details(w http.ResponseWriter, r *http.Request) {
	if d, unlock := s.lockDeployment(w, r); d != nil {
		defer unlock()
		writeJSON(w, http.StatusOK, map[string]any{"data": s.detailsOf(d)})
	}
}

type listItemJSON struct {
	ID                      string  `json:"id"`
	Status                  string  `json:"status"`
	Name                    string  `json:"name"`
	CompletedPercent        float64 `json:"completed_percent"`
	HardwareQuantity        int     `json:"hardware_quantity"`
	BrandName               string  `json:"brand_name"`
	HardwareName            string  `json:"hardware_name"`
	ComputeMinutesServed    int     `json:"compute_minutes_served"`
	ComputeMinutesRemaining int     `json:"compute_minutes_remaining"`
}

// Page sizes of the list routes.
const (
	maxPageSize               = 100 // page_size maximum of every list
	defaultPageSize           = 10  // deployments
	defaultContainersPageSize = 20  // containers and container jobs
)

// page returns the items of a zero-based page of size n out of total:
// [from, to). The schemas give page no minimum; a negative page is empty.
func page(p, n, total int) (from, to int) {
	if p < 0 || n <= 0 || p > total/n {
		return 0, 0
	}
	return p * n, min((p+1)*n, total)
}

// list serves GET caas/deployments?status=&page=&page_size=: newest first,
// zero-based pages of at most 100 (default 10). status is
// CaaSResourceStatus: the console's "all" is not one of its values.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	var v validator
	q := r.URL.Query()
	pg := v.queryInt(q, "page", false, 0, noMin, 0)
	size := v.queryInt(q, "page_size", false, defaultPageSize, 1, maxPageSize)
	status := q.Get("status")
	if q.Has("status") && !slices.Contains(statuses, status) {
		v.add("enum", loc("query", "status"), "Input should be 'running', 'completed', 'failed', 'deployment requested', 'termination requested' or 'destroyed'",
			status, map[string]any{"expected": "'running', 'completed', 'failed', 'deployment requested', 'termination requested' or 'destroyed'"})
	}
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	now := s.opts.Now()
	var match []*deployment
	seen := map[string]bool{}
	for i := len(s.order) - 1; i >= 0; i-- {
		d := s.order[i]
		if status == "" || d.status == status {
			match = append(match, d)
			seen[d.status] = true
		}
	}
	items := []listItemJSON{}
	from, to := page(pg, size, len(match))
	for i := from; i < to; i++ {
		d := match[i]
		served, remaining := d.minutes(now)
		items = append(items, listItemJSON{ID: d.id, Status: d.status, Name: d.name,
			CompletedPercent: percent(served, d.hours*60), HardwareQuantity: d.gpus * d.replicas,
			BrandName: d.hw.Brand, HardwareName: d.hw.Name,
			ComputeMinutesServed: served, ComputeMinutesRemaining: remaining})
	}
	present := []string{}
	for st := range seen {
		present = append(present, st)
	}
	sort.Strings(present)
	writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{
		"deployments": items, "total": len(match), "statuses": present}})
}

type workerJSON struct {
	DeviceID         string      `json:"device_id"`
	ContainerID      string      `json:"container_id"`
	Hardware         string      `json:"hardware"`
	BrandName        string      `json:"brand_name"`
	CreatedAt        string      `json:"created_at"`
	UptimePercent    int         `json:"uptime_percent"`
	GPUsPerContainer int         `json:"gpus_per_container"`
	Status           string      `json:"status"`
	ContainerEvents  []eventJSON `json:"container_events"`
	PublicURL        *string     `json:"public_url"`
}

// containers serves GET caas/deployment/{id}/containers?page=&page_size=:
// public_url is null until the container runs.
func (s *Server) containers(w http.ResponseWriter, r *http.Request) {
	s.workerList(w, r, func(*worker) bool { return true })
}

// containerJobs serves GET
// caas/deployment/{id}/containers-jobs/{container}?page=&page_size=: the
// job history of one container, in the containers' shape. A simulated
// container never restarts, so its history is one job.
func (s *Server) containerJobs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("container")
	s.workerList(w, r, func(wk *worker) bool { return wk.containerID == id })
}

// workerList serves a page of the workers of the request's deployment that
// keep accepts, answering 404 when keep accepts none.
func (s *Server) workerList(w http.ResponseWriter, r *http.Request, keep func(*worker) bool) {
	var v validator
	q := r.URL.Query()
	pg := v.queryInt(q, "page", false, 0, noMin, 0)
	size := v.queryInt(q, "page_size", false, defaultContainersPageSize, 1, maxPageSize)
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	d, unlock := s.lockDeployment(w, r)
	if d == nil {
		return
	}
	defer unlock()
	var kept []*worker
	for _, wk := range d.workers {
		if keep(wk) {
			kept = append(kept, wk)
		}
	}
	if len(kept) == 0 && len(d.workers) > 0 {
		writeDetail(w, http.StatusNotFound, "Container not found")
		return
	}
	out := []workerJSON{}
	from, to := page(pg, size, len(kept))
	for _, wk := range kept[from:to] {
		out = append(out, d.workerJSON(wk))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"total": len(kept), "workers": out}})
}

// workerJSON renders one container of d as WorkerData.
func (d *deployment) workerJSON(wk *worker) workerJSON {
	wj := workerJSON{DeviceID: wk.deviceID, ContainerID: wk.containerID, Hardware: d.hw.Name,
		BrandName: d.hw.Brand, CreatedAt: withZ(wk.created), GPUsPerContainer: d.gpus,
		ContainerEvents: append([]eventJSON{}, wk.events...)}
	switch d.status {
	case stRequested:
		wj.Status = "pending"
	case stRunning:
		wj.Status, wj.UptimePercent = "running", 100
	case stFailed:
		wj.Status = "failed"
	default:
		wj.Status = "terminated"
	}
	if wk.inf != nil {
		u := wk.inf.url
		wj.PublicURL = &u
	}
	return wj
}

// nodePools serves GET caas/node-pools: the account's private node pools,
// of which the simulator has none.
func (s *Server) nodePools(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"data": []any{}})
}

// logs serves GET caas/deployment/{id}/log/{container}?stream=: plain text
// lines, not JSON.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	stream := r.URL.Query().Get("stream")
	if stream == "" {
		stream = "stdout"
	}
	if stream != "stdout" && stream != "stderr" {
		write422(w, []detailItem{{Type: "enum", Loc: loc("query", "stream"), Msg: "Input should be 'stdout' or 'stderr'", Input: stream}})
		return
	}
	d, unlock := s.lockDeployment(w, r)
	if d == nil {
		return
	}
	defer unlock()
	var wk *worker
	for _, c := range d.workers {
		if c.containerID == r.PathValue("container") {
			wk = c
		}
	}
	if wk == nil {
		writeDetail(w, http.StatusNotFound, "Container not found")
		return
	}
	var b strings.Builder
	if stream == "stdout" {
		for _, e := range wk.events {
			fmt.Fprintf(&b, "%s %s\n", e.Time, e.Message)
		}
		if wk.inf != nil {
			fmt.Fprintf(&b, "%s INFO: serving OpenAI-compatible API on 0.0.0.0:%d\n", withZ(d.started), d.port)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
