package ionetsim

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// io.net's deployment statuses: lowercase, with spaces.
const (
	stRequested   = "deployment requested"
	stRunning     = "running"
	stCompleted   = "completed"
	stFailed      = "failed"
	stTerminating = "termination requested"
	stDestroyed   = "destroyed"
)

// statuses is the CaaSResourceStatus enum, in the spec's order.
var statuses = []string{stRunning, stCompleted, stFailed, stRequested, stTerminating, stDestroyed}

// deployment is one simulated CaaS deployment. Fields are guarded by s.mu.
type deployment struct {
	id, name        string
	hw              *Hardware
	loc             Stock
	gpus, replicas  int
	hours           int
	paid, refunded  gpuproxy.Micros
	status          string
	destroyed       bool // DELETE accepted
	holding         bool // its GPUs are taken from the stock
	created         time.Time
	started         time.Time
	finished        time.Time
	image           string
	port            int
	env, secrets    map[string]string
	entrypoint      []string
	args            []string
	command         *string
	workers         []*worker
	registryUser    string
	registrySecrets bool
}

// worker is one container of a deployment.
type worker struct {
	deviceID, containerID string
	created               time.Time
	inf                   *inference
	events                []eventJSON
}

type eventJSON struct {
	Time    string `json:"time"`
	Message string `json:"message"`
}

// SimDeployment is a snapshot of a simulated deployment, for tests.
type SimDeployment struct {
	ID               string
	Name             string // resource_private_name: our tag
	Status           string // io.net status, e.g. "deployment requested"
	HardwareID       int
	LocationID       int
	GPUsPerContainer int
	Replicas         int
	DurationHours    int
	Image            string
	TrafficPort      int
	Env              map[string]string
	SecretEnvKeys    []string
	AmountPaid       gpuproxy.Micros // prepaid total, extensions included
	Refunded         gpuproxy.Micros // refunded on destroy
	Destroyed        bool            // a DELETE was accepted
	CreatedAt        time.Time
	StartedAt        time.Time
	FinishedAt       time.Time
	PublicURLs       []string // one per running container
	// Args are container_config.args; RegistryUser and RegistrySecret
	// the registry login (the secret only as given or not, as io.net
	// never echoes it).
	Args           []string
	RegistryUser   string
	RegistrySecret bool
}

// Deployments returns every deployment ever created, oldest first.
func (s *Server) Deployments() []SimDeployment {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	out := make([]SimDeployment, 0, len(s.order))
	for _, d := range s.order {
		sd := SimDeployment{ID: d.id, Name: d.name, Status: d.status, HardwareID: d.hw.ID,
			LocationID: d.loc.LocationID, GPUsPerContainer: d.gpus, Replicas: d.replicas,
			DurationHours: d.hours, Image: d.image, TrafficPort: d.port, Env: map[string]string{},
			AmountPaid: d.paid, Refunded: d.refunded, Destroyed: d.destroyed,
			CreatedAt: d.created, StartedAt: d.started, FinishedAt: d.finished,
			Args: slices.Clone(d.args), RegistryUser: d.registryUser, RegistrySecret: d.registrySecrets}
		for k, v := range d.env {
			sd.Env[k] = v
		}
		sd.SecretEnvKeys = d.secretKeys()
		for _, wk := range d.workers {
			if wk.inf != nil {
				sd.PublicURLs = append(sd.PublicURLs, wk.inf.url)
			}
		}
		out = append(out, sd)
	}
	return out
}

func (d *deployment) secretKeys() []string {
	keys := make([]string, 0, len(d.secrets))
	for k := range d.secrets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// advance moves every deployment along its lifecycle up to now:
// requested → running (containers listen) → completed when the prepaid time
// runs out; termination requested → destroyed. The caller holds s.mu.
func (s *Server) advance() {
	now := s.opts.Now().UTC()
	s.releaseHolds(now)
	s.walkCapacity(now)
	closed := false
	select {
	case <-s.closing: // no new listeners once closed
		closed = true
	default:
	}
	for _, d := range s.order {
		if d.status == stRequested && !closed && !now.Before(d.created.Add(s.opts.StartDelay)) {
			d.started = d.created.Add(s.opts.StartDelay)
			if err := d.startWorkers(s.opts.ChunkDelay); err != nil {
				d.status, d.finished = stFailed, now
				d.stopWorkers()
				s.release(d)
			} else {
				d.status = stRunning
			}
		}
		if d.status == stRunning && !now.Before(d.started.Add(time.Duration(d.hours)*time.Hour)) {
			d.status, d.finished = stCompleted, d.started.Add(time.Duration(d.hours)*time.Hour)
			d.stopWorkers()
			s.release(d)
		}
		if d.status == stTerminating && !now.Before(d.finished.Add(s.opts.TerminateDelay)) {
			d.status = stDestroyed
		}
	}
}

// release returns d's GPUs to the stock once.
func (s *Server) release(d *deployment) {
	if !d.holding {
		return
	}
	d.holding = false
	if st := stockOf(d.hw, d.loc.LocationID); st != nil {
		st.FreeGPUs += d.gpus * d.replicas
	}
}

// startWorkers gives every container its inference listener.
func (d *deployment) startWorkers(chunkDelay time.Duration) error {
	model := d.env["MODEL"]
	for _, wk := range d.workers {
		inf, err := startInference(model, chunkDelay)
		if err != nil {
			return err
		}
		wk.inf = inf
		wk.events = append(wk.events, eventJSON{Time: withZ(d.started), Message: "Container started"},
			eventJSON{Time: withZ(d.started), Message: fmt.Sprintf("Health check passed on port %d", d.port)})
	}
	return nil
}

// stopWorkers closes every container's listener.
func (d *deployment) stopWorkers() {
	for _, wk := range d.workers {
		if wk.inf != nil {
			wk.inf.close()
			wk.inf = nil
		}
	}
}

// refund applies io.net's early-destroy rule: the first hour is kept; the
// rest of the unused prepaid time is refunded pro rata on exact runtime.
func refund(paid gpuproxy.Micros, hours int, started, at time.Time) gpuproxy.Micros {
	prepaid := time.Duration(hours) * time.Hour
	ran := max(at.Sub(started), time.Hour)
	if paid <= 0 || ran >= prepaid {
		return 0
	}
	r := new(big.Int).Mul(big.NewInt(int64(paid)), big.NewInt(int64(prepaid-ran)))
	return gpuproxy.Micros(r.Quo(r, big.NewInt(int64(prepaid))).Int64())
}

// lockDeployment takes the server lock, advances every lifecycle to now and
// finds the deployment of the request's path. When it returns nil the reply
// is written and the lock released; otherwise the caller calls unlock.
func (s *Server) lockDeployment(w http.ResponseWriter, r *http.Request) (d *deployment, unlock func()) {
	s.mu.Lock()
	s.advance()
	if d = s.lookup(w, r); d == nil {
		s.mu.Unlock()
		return nil, nil
	}
	return d, s.mu.Unlock
}

// lookup finds the deployment of the {id} path value, answering 422 for a
// malformed UUID and 404 for an unknown one. Like Pydantic, it reads the
// UUID in any case, with or without hyphens. The caller holds s.mu.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) *deployment {
	id := r.PathValue("id")
	var v validator
	if !v.uuid(loc("path", "deployment_id"), id) {
		write422(w, v.errs)
		return nil
	}
	d := s.deps[canonicalUUID(id)]
	if d == nil {
		writeDetail(w, http.StatusNotFound, "Deployment not found")
	}
	return d
}

// canonicalUUID writes a UUID as newUUID does: lowercase, hyphenated.
func canonicalUUID(s string) string {
	h := strings.ToLower(strings.ReplaceAll(s, "-", ""))
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// destroy serves DELETE caas/deployment/{id}: the deployment goes to
// "termination requested", its containers stop, its GPUs return to the
// stock and the unused prepaid time is refunded. Deleting a destroyed
// deployment answers 404, the one error (besides 422) the spec lists; one
// still terminating answers 200 again.
func (s *Server) destroy(w http.ResponseWriter, r *http.Request) {
	d, unlock := s.lockDeployment(w, r)
	if d == nil {
		return
	}
	defer unlock()
	switch d.status {
	case stDestroyed:
		writeDetail(w, http.StatusNotFound, "Deployment %s is already destroyed", d.id)
		return
	case stTerminating:
	default:
		now := s.opts.Now().UTC()
		start := d.started
		if start.IsZero() {
			start = d.created
		}
		if d.status == stRunning || d.status == stRequested {
			d.refunded = refund(d.paid, d.hours, start, now)
			d.finished = now
		} else if d.finished.IsZero() {
			d.finished = now
		}
		d.status, d.destroyed = stTerminating, true
		d.stopWorkers()
		s.release(d)
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": stTerminating, "deployment_id": d.id})
}

// extend serves POST caas/deployment/{id}/extend {"duration_hours": n}:
// n more hours are paid and the details are returned, wrapped. Unlike the
// deploy body, ExtendCluster does not forbid other members: they are
// ignored.
func (s *Server) extend(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	var v validator
	raw, ok := v.decodeBody(body)
	var n int
	if ok {
		m := v.object(raw, loc("body"), anyKey)
		if m != nil {
			var has bool
			if n, has = v.intField(m, loc("body"), "duration_hours", true); has && n <= 0 {
				v.add("greater_than", loc("body", "duration_hours"), "Input should be greater than 0", n, map[string]any{"gt": 0})
			}
		}
	}
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	d, unlock := s.lockDeployment(w, r)
	if d == nil {
		return
	}
	defer unlock()
	if d.status != stRunning && d.status != stRequested {
		writeDetail(w, http.StatusBadRequest, "Deployment is %s and cannot be extended", d.status)
		return
	}
	d.hours += n
	d.paid += cost(d.hw, d.gpus, d.replicas, n)
	writeJSON(w, http.StatusOK, map[string]any{"data": s.detailsOf(d)})
}
