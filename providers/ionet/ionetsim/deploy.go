package ionetsim

import (
	"io"
	"net/http"
	"strings"
)

// deployKeys are CaaSDeployClusterRequest's members; others are 422
// extra_forbidden, as are unknown members of the nested configs.
var (
	deployKeys    = []string{"resource_private_name", "duration_hours", "gpus_per_container", "hardware_id", "location_ids", "node_pool_id", "container_config", "registry_config"}
	containerKeys = []string{"replica_count", "traffic_port", "env_variables", "secret_env_variables", "entrypoint", "args", "command"}
	registryKeys  = []string{"image_url", "registry_username", "registry_secret"}
	updateKeys    = []string{"env_variables", "secret_env_variables", "entrypoint", "traffic_port", "image_url", "registry_username", "registry_secret", "args", "command"}
)

// deploySpec is a validated deploy body.
type deploySpec struct {
	name                  string
	hours, gpus, hardware int
	locations             []int
	hasLocations, hasPool bool
	replicas, port        int
	env, secrets          map[string]*string
	entrypoint, args      []string
	command               *string
	image, registryUser   string
	registrySecret        bool
}

// parseDeploy validates a deploy body like FastAPI would.
func parseDeploy(v *validator, body []byte) deploySpec {
	var sp deploySpec
	raw, ok := v.decodeBody(body)
	if !ok {
		return sp
	}
	b := loc("body")
	m := v.object(raw, b, deployKeys...)
	if m == nil {
		return sp
	}
	sp.name, _ = v.strField(m, b, "resource_private_name", true)
	if h, ok := v.intField(m, b, "duration_hours", true); ok {
		sp.hours = h
		if h <= 0 {
			v.add("greater_than", with(b, "duration_hours"), "Input should be greater than 0", h, map[string]any{"gt": 0})
		} else {
			v.bound(with(b, "duration_hours"), h, h, 1, MaxDurationHours)
		}
	}
	if g, ok := v.intField(m, b, "gpus_per_container", true); ok {
		sp.gpus = g
		v.bound(with(b, "gpus_per_container"), g, g, 1, MaxGPUsPerContainer)
	}
	sp.hardware, _ = v.intField(m, b, "hardware_id", true)
	sp.locations, sp.hasLocations = listField[int](v, m, b, "location_ids", 1, 1)
	if pool, ok := v.strField(m, b, "node_pool_id", false); ok {
		sp.hasPool = v.uuid(with(b, "node_pool_id"), pool)
	}

	if raw, has := m["container_config"]; !has {
		v.add("missing", with(b, "container_config"), "Field required", nil, nil)
	} else if cm := v.object(raw, with(b, "container_config"), containerKeys...); cm != nil {
		cl := with(b, "container_config")
		// The schema bounds neither replica_count nor traffic_port:
		// deploy refuses nonsense after validation, with a 400.
		sp.replicas, _ = v.intField(cm, cl, "replica_count", true)
		sp.port, _ = v.intField(cm, cl, "traffic_port", true)
		// Unlike PATCH, deploy's env maps are not nullable.
		sp.env, _ = v.mapField(cm, cl, "env_variables", false, false)
		sp.secrets, _ = v.mapField(cm, cl, "secret_env_variables", false, false)
		sp.entrypoint, _ = listField[string](v, cm, cl, "entrypoint", 1, 0)
		sp.args, _ = listField[string](v, cm, cl, "args", 1, 0)
		if c, ok := v.strField(cm, cl, "command", false); ok {
			sp.command = &c
		}
	}
	if raw, has := m["registry_config"]; !has {
		v.add("missing", with(b, "registry_config"), "Field required", nil, nil)
	} else if rm := v.object(raw, with(b, "registry_config"), registryKeys...); rm != nil {
		rl := with(b, "registry_config")
		sp.image, _ = v.strField(rm, rl, "image_url", true)
		sp.registryUser, _ = v.strField(rm, rl, "registry_username", false)
		_, sp.registrySecret = v.strField(rm, rl, "registry_secret", false)
	}
	return sp
}

// deploy serves POST caas/deploy: it validates, takes the GPUs from the
// stock, charges the prepaid total and answers the bare
// {"status","deployment_id"}.
func (s *Server) deploy(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	s.mu.Lock()
	reject := s.takeFault(r, faultReject)
	s.mu.Unlock()
	if reject != nil {
		write422(w, []detailItem{{Type: "value_error", Loc: loc("body", "registry_config", "image_url"),
			Msg: "Value error, image could not be pulled from the registry", Input: nil}})
		return
	}
	var v validator
	sp := parseDeploy(&v, body)
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	s.takePending() // someone else may have rented what we listed
	switch {
	case sp.hasPool && sp.hasLocations: // the schema: "Can't be used if location_ids are provided."
		writeDetail(w, http.StatusBadRequest, "node_pool_id can't be used if location_ids are provided")
		return
	case sp.hasPool:
		writeDetail(w, http.StatusBadRequest, "Node pool not found")
		return
	case !sp.hasLocations:
		writeDetail(w, http.StatusBadRequest, "location_ids is required when no node_pool_id is given")
		return
	case strings.TrimSpace(sp.name) == "":
		writeDetail(w, http.StatusBadRequest, "resource_private_name must not be empty")
		return
	case sp.replicas < 1:
		writeDetail(w, http.StatusBadRequest, "replica_count must be at least 1, got %d", sp.replicas)
		return
	case badPort(sp.port):
		writeDetail(w, http.StatusBadRequest, "traffic_port must be between 1 and 65535, got %d", sp.port)
		return
	}
	for _, d := range s.order {
		if d.name == sp.name && d.status != stDestroyed {
			writeDetail(w, http.StatusConflict, "A deployment named %q already exists", sp.name)
			return
		}
	}
	h := s.findHardware(sp.hardware)
	if h == nil {
		writeDetail(w, http.StatusNotFound, "Hardware %d not found", sp.hardware)
		return
	}
	st := stockOf(h, sp.locations[0])
	if got := replicasOf(h, st, sp.gpus); got < sp.replicas {
		writeDetail(w, http.StatusBadRequest,
			"Not enough capacity: %d container(s) of %d GPU(s) of hardware %d requested in location %d, %d available",
			sp.replicas, sp.gpus, h.ID, sp.locations[0], got)
		return
	}
	st.FreeGPUs -= sp.gpus * sp.replicas
	now := s.opts.Now().UTC()
	d := &deployment{
		id: newUUID(), name: sp.name, hw: h, loc: *st, gpus: sp.gpus, replicas: sp.replicas,
		hours: sp.hours, paid: cost(h, sp.gpus, sp.replicas, sp.hours), status: stRequested,
		holding: true, created: now, image: sp.image, port: sp.port,
		env: map[string]string{}, secrets: map[string]string{}, entrypoint: sp.entrypoint,
		args: sp.args, command: sp.command, registryUser: sp.registryUser, registrySecrets: sp.registrySecret,
	}
	for k, p := range sp.env {
		d.env[k] = *p
	}
	for k, p := range sp.secrets {
		d.secrets[k] = *p
	}
	for range sp.replicas {
		d.workers = append(d.workers, &worker{deviceID: newUUID(), containerID: newUUID()[:13], created: now,
			events: []eventJSON{{Time: withZ(now), Message: "Pulling image " + sp.image}}})
	}
	s.deps[d.id] = d
	s.order = append(s.order, d)

	if f := s.takeFault(r, faultAmbiguous); f != nil {
		if f.mode == AmbiguousDropConnection {
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close()
					return
				}
			}
			panic(http.ErrAbortHandler) // drops the connection where hijacking is impossible
		}
		writeFault(w, http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "success", "deployment_id": d.id})
}

// updateSpec is a validated ContainerUpdateRequest: every member optional,
// null meaning "unchanged" (secret values excepted: null deletes one).
type updateSpec struct {
	env, secrets               map[string]*string
	hasEnv                     bool
	image, command             *string
	port                       *int
	entrypoint, args           []string
	hasEntrypoint, hasArgs     bool
	registryUser, registrySecr *string
}

// parseUpdate validates a PATCH body like FastAPI would: members at the top
// level, unknown ones (container_config included) 422 extra_forbidden.
func parseUpdate(v *validator, body []byte) updateSpec {
	var u updateSpec
	b := loc("body")
	raw, ok := v.decodeBody(body)
	if !ok {
		return u
	}
	m := v.object(raw, b, updateKeys...)
	if m == nil {
		return u
	}
	opt := func(key string) *string {
		if s, ok := v.strField(m, b, key, false); ok {
			return &s
		}
		return nil
	}
	u.env, u.hasEnv = v.mapField(m, b, "env_variables", true, false)
	u.secrets, _ = v.mapField(m, b, "secret_env_variables", true, true)
	u.entrypoint, u.hasEntrypoint = listField[string](v, m, b, "entrypoint", 0, 0)
	if p, ok := v.intField(m, b, "traffic_port", false); ok {
		u.port = &p
	}
	u.image = opt("image_url")
	u.registryUser, u.registrySecr = opt("registry_username"), opt("registry_secret")
	u.args, u.hasArgs = listField[string](v, m, b, "args", 0, 0)
	u.command = opt("command")
	return u
}

// update serves PATCH caas/deployment/{id}: top-level container settings;
// env_variables replaces the map, secret_env_variables merges (null
// deletes a key). container_config here is 422 extra_forbidden.
func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	var v validator
	u := parseUpdate(&v, body)
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	d, unlock := s.lockDeployment(w, r)
	if d == nil {
		return
	}
	defer unlock()
	switch {
	case d.status != stRunning && d.status != stRequested:
		writeDetail(w, http.StatusBadRequest, "Deployment is %s and cannot be updated", d.status)
		return
	case u.port != nil && badPort(*u.port):
		writeDetail(w, http.StatusBadRequest, "traffic_port must be between 1 and 65535, got %d", *u.port)
		return
	}
	if u.hasEnv {
		d.env = map[string]string{}
		for k, p := range u.env {
			d.env[k] = *p
		}
	}
	for k, p := range u.secrets {
		if p == nil {
			delete(d.secrets, k)
		} else {
			d.secrets[k] = *p
		}
	}
	if u.image != nil {
		d.image = *u.image
	}
	if u.port != nil {
		d.port = *u.port
	}
	if u.hasEntrypoint {
		d.entrypoint = u.entrypoint
	}
	if u.hasArgs {
		d.args = u.args
	}
	if u.command != nil {
		d.command = u.command
	}
	if u.registryUser != nil {
		d.registryUser = *u.registryUser
	}
	if u.registrySecr != nil {
		d.registrySecrets = true
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "success", "deployment_id": d.id})
}

// badPort reports a traffic_port no container can listen on.
func badPort(p int) bool { return p < 1 || p > 65535 }
