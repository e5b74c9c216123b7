package vastaisim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SimInstance is a snapshot of one simulated instance, for tests.
type SimInstance struct {
	ID          int64
	OfferID     int64
	Label       string
	Image       string
	Env         map[string]string // the create env, port flags included
	DiskGB      float64
	Status      string // actual_status; "" while it is null
	Destroyed   bool
	Endpoint    string // inference base URL while running, else ""
	DPHTotal    float64
	CreatedAt   time.Time
	DestroyedAt time.Time
}

// instance is the server-side state of one rented offer.
type instance struct {
	id          int64
	offer       Offer // priced for the instance's disk
	label       string
	image       string
	runtype     string
	onstart     string
	env         [][2]string
	disk        float64
	isBid       bool
	created     time.Time // start_date
	phaseStart  time.Time // start of the current null → loading → running run
	intended    string    // "running" or "stopped"
	forced      string    // actual_status set by SetInstanceStatus
	statusMsg   string
	inf         *InferenceServer
	destroyed   bool
	destroyedAt time.Time
}

func (in *instance) stopInference() {
	if in.inf != nil {
		in.inf.Close()
		in.inf = nil
	}
}

// status computes actual_status ("" for null) and starts or stops the
// inference server to match; s.mu must be held.
func (s *Server) status(in *instance) string {
	if in.destroyed {
		in.stopInference()
		return ""
	}
	var st string
	switch {
	case in.forced != "":
		st = in.forced
	case in.intended == "stopped":
		st = "stopped"
	default:
		el, d := s.now().Sub(in.phaseStart), s.opts.StartDelay
		switch {
		case el < d/3:
			st = ""
		case el < d:
			st = "loading"
		default:
			st = "running"
		}
	}
	if st == "running" && in.inf == nil && !s.closed() {
		inf, err := StartInference(s.opts.Model)
		if err != nil {
			in.forced, in.statusMsg = "exited", "inference server failed: "+err.Error()
			return in.forced
		}
		inf.SetChunkDelay(s.opts.ChunkDelay)
		in.inf = inf
		in.statusMsg = "success, running " + in.image
	}
	if st != "running" {
		in.stopInference()
	}
	return st
}

// containerPorts lists the TCP container ports of "-p H:C" env keys, or
// 8000 when none is declared.
func (in *instance) containerPorts() []string {
	var out []string
	for _, kv := range in.env {
		f := strings.Fields(kv[0])
		if len(f) != 2 || f[0] != "-p" || strings.HasSuffix(f[1], "/udp") {
			continue
		}
		m := strings.TrimSuffix(f[1], "/tcp")
		if i := strings.LastIndex(m, ":"); i >= 0 {
			m = m[i+1:]
		}
		if _, err := strconv.Atoi(m); err == nil {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		out = []string{"8000"}
	}
	return out
}

// instanceJSON renders an instance in the wire format; s.mu must be held.
func (s *Server) instanceJSON(in *instance) map[string]any {
	st := s.status(in)
	o := in.offer
	var actual any
	if st != "" {
		actual = st
	}
	curState := "running"
	if in.intended == "stopped" {
		curState = "stopped"
	}
	pairs := make([][]string, 0, len(in.env))
	for _, kv := range in.env {
		pairs = append(pairs, []string{kv[0], kv[1]})
	}
	var label any
	if in.label != "" {
		label = in.label
	}
	var ports any
	uptime := 0.0
	if st == "running" && in.inf != nil {
		hp := strconv.Itoa(in.inf.Port())
		pm := map[string]any{}
		for _, p := range in.containerPorts() {
			pm[p+"/tcp"] = []map[string]string{{"HostIp": "0.0.0.0", "HostPort": hp}}
		}
		ports = pm
		uptime = s.now().Sub(in.phaseStart).Minutes()
	}
	start := float64(in.created.UnixNano()) / 1e9
	return map[string]any{
		"id": in.id, "machine_id": o.MachineID, "host_id": o.HostID, "bundle_id": o.BundleID,
		"actual_status": actual, "intended_status": in.intended, "cur_state": curState, "next_state": curState,
		"status_msg": in.statusMsg, "label": label,
		"image_uuid": in.image, "image_runtype": in.runtype, "image_args": []string{}, "onstart": in.onstart,
		"extra_env": pairs, "template_id": nil, "template_hash_id": nil, "jupyter_token": "",
		"gpu_name": o.GPUName, "num_gpus": o.NumGPUs, "gpu_ram": o.GPURAM, "gpu_totalram": o.GPUTotalRAM,
		"gpu_frac": o.GPUFrac, "gpu_arch": o.GPUArch, "gpu_mem_bw": o.GPUMemBW, "gpu_util": 0.0, "gpu_temp": 35.0,
		"cuda_max_good": o.CUDAMaxGood, "driver_version": o.DriverVersion,
		"cpu_name": o.CPUName, "cpu_cores": o.CPUCores, "cpu_cores_effective": o.CPUCoresEffective,
		"cpu_ram": o.CPURAM, "cpu_util": 0.0, "disk_space": in.disk, "disk_usage": 0.0, "disk_bw": o.DiskBW,
		"inet_up": o.InetUp, "inet_down": o.InetDown,
		"dph_total": o.DPHTotal, "dph_base": o.DPHBase, "storage_cost": o.StorageCost,
		"storage_total_cost": o.StorageTotalCost, "is_bid": in.isBid, "min_bid": o.MinBid,
		"public_ipaddr": "127.0.0.1", "local_ipaddrs": "127.0.0.1",
		"ssh_host": "127.0.0.1", "ssh_port": 20000 + int(in.id%10000), "ssh_idx": "5",
		"ports": ports, "direct_port_start": -1, "direct_port_end": -1, "direct_port_count": o.DirectPortCount,
		"start_date": start, "end_date": start + o.Duration, "duration": o.Duration, "uptime_mins": uptime,
		"reliability2": o.Reliability2, "geolocation": o.Geolocation, "verification": o.Verification,
		"static_ip": o.StaticIP, "rentable": true, "external": false, "time_remaining": "", "volume_info": []any{},
	}
}

// createRequest is the PUT /asks/{id}/ body.
type createRequest struct {
	ClientID string          `json:"client_id"`
	Image    string          `json:"image"`
	Disk     *float64        `json:"disk"`
	Label    string          `json:"label"`
	Env      json.RawMessage `json:"env"`
	Runtype  string          `json:"runtype"`
	Onstart  string          `json:"onstart"`
	Price    *float64        `json:"price"`
}

// parseEnv reads env as an object, or as a docker-flag string.
func parseEnv(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err == nil {
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][2]string, 0, len(keys))
		for _, k := range keys {
			v := fmt.Sprint(obj[k])
			if len(v) > 256 {
				return nil, fmt.Errorf("env value of %s is longer than 256", k)
			}
			out = append(out, [2]string{k, v})
		}
		return out, nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return nil, fmt.Errorf("env must be an object")
	}
	var out [][2]string
	f := strings.Fields(str)
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "-p" && i+1 < len(f):
			out = append(out, [2]string{"-p " + f[i+1], "1"})
			i++
		case f[i] == "-e" && i+1 < len(f):
			k, v, _ := strings.Cut(f[i+1], "=")
			out = append(out, [2]string{k, v})
			i++
		}
	}
	return out, nil
}

// createInstance answers PUT /api/v0/asks/{id}/.
func (s *Server) createInstance(w http.ResponseWriter, _ *http.Request, body []byte, askID int64) {
	var req createRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_args", "error 400/3467: Invalid args: invalid json body")
		return
	}
	env, err := parseEnv(req.Env)
	bad := func(slug, msg string) {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": slug,
			"msg": "error 400/3467: Invalid args: " + msg, "ask_id": askID})
	}
	switch {
	case err != nil:
		bad("invalid_args", err.Error())
		return
	case strings.TrimSpace(req.Image) == "" || len(req.Image) > 1024:
		bad("invalid_args", "image is required (at most 1024 characters)")
		return
	case len(req.Label) > 256:
		bad("label_too_long", "label is longer than 256 characters")
		return
	case req.Disk != nil && *req.Disk < 8:
		bad("invalid_args", "disk must be at least 8 GB")
		return
	case req.Price != nil && (*req.Price < 0.001 || *req.Price > 128):
		bad("invalid_price", "price must be between 0.001 and 128")
		return
	}
	disk := 8.0
	if req.Disk != nil {
		disk = *req.Disk
	}
	s.mu.Lock()
	o := s.offers[askID]
	switch {
	case o == nil:
		s.mu.Unlock()
		writeJSON(w, http.StatusNotFound, map[string]any{"success": false, "error": "invalid_args",
			"msg": fmt.Sprintf("error 404/3603: no_such_ask Instance type by id %d is not available.", askID), "ask_id": askID})
		return
	case o.Rented || !o.Rentable:
		s.mu.Unlock()
		writeJSON(w, http.StatusGone, map[string]any{"success": false, "error": "no_such_ask",
			"msg": fmt.Sprintf("error 410/3907: no_such_ask Instance type %d is no longer available.", askID), "ask_id": askID})
		return
	case disk > o.DiskSpace:
		s.mu.Unlock()
		bad("invalid_args", fmt.Sprintf("disk %g GB exceeds the %g GB available", disk, o.DiskSpace))
		return
	}
	o.Rented = true
	now := s.now()
	in := &instance{
		id: s.nextInstance, offer: o.priced(disk), label: req.Label, image: req.Image,
		runtype: req.Runtype, onstart: req.Onstart, env: env, disk: disk, isBid: req.Price != nil,
		created: now, phaseStart: now, intended: "running",
	}
	if in.runtype == "" {
		in.runtype = "ssh"
	}
	s.nextInstance++
	s.instances[in.id] = in
	lowBid := req.Price != nil && *req.Price < o.MinBid
	if lowBid {
		in.intended = "stopped"
	}
	mode, ambiguous := s.faults.takeAmbiguous()
	if ambiguous && mode == AmbiguousStopped {
		in.intended = "stopped"
	}
	s.mu.Unlock()

	switch {
	case lowBid: // the bid is too low: the instance exists, stopped, yet the reply is an error
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": "invalid_price",
			"msg":          fmt.Sprintf("bid %g is below the minimum %g; instance created stopped", *req.Price, o.MinBid),
			"new_contract": in.id, "ask_id": askID})
	case ambiguous && mode == AmbiguousServerError:
		writeJSON(w, http.StatusInternalServerError, map[string]any{"success": false, "error": "internal_error",
			"msg": "error 500: internal error while renting", "new_contract": in.id})
	case ambiguous && mode == AmbiguousStopped:
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": "invalid_args",
			"msg": "error 400: instance could not be scheduled; created stopped", "new_contract": in.id, "ask_id": askID})
	case ambiguous && mode == AmbiguousDrop:
		dropConnection(w)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "new_contract": in.id,
			"instance_api_key": randomHex(32)})
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lookup returns a live instance; s.mu must be held.
func (s *Server) lookup(id int64) (*instance, error) {
	in := s.instances[id]
	if in == nil || in.destroyed {
		return nil, errNoInstance
	}
	return in, nil
}

// showInstance answers GET /api/v0/instances/{id}/ with the object under
// the plural key, or {"instances":null} when gone.
func (s *Server) showInstance(w http.ResponseWriter, _ *http.Request, _ []byte, id int64) {
	s.mu.Lock()
	in, err := s.lookup(id)
	var obj map[string]any
	if err == nil {
		obj = s.instanceJSON(in)
	}
	s.mu.Unlock()
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"instances": obj})
	case s.opts.MissingInstance404:
		writeError(w, http.StatusNotFound, "not_found", "Instance not found")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"instances": nil})
	}
}

// queryJSON reads a query parameter that clients JSON-encode; plain
// strings are accepted too.
func queryJSON(r *http.Request, name string) (any, bool) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return nil, false
	}
	var v any
	if json.Unmarshal([]byte(raw), &v) != nil {
		return raw, true
	}
	return v, true
}

// listInstancesV1 answers GET /api/v1/instances/: pages of at most 25 in
// id order, with next_token/after_token.
func (s *Server) listInstancesV1(w http.ResponseWriter, r *http.Request, _ []byte, _ int64) {
	limit := 25
	if v, ok := queryJSON(r, "limit"); ok {
		switch n, _ := v.(float64); {
		case n <= 0:
			limit = 5
		case n < 25:
			limit = int(n)
		}
	}
	after := int64(0)
	if v, ok := queryJSON(r, "after_token"); ok {
		tok, _ := v.(string)
		n, err := strconv.ParseInt(strings.TrimPrefix(tok, "tok_"), 36, 64)
		if !strings.HasPrefix(tok, "tok_") || err != nil {
			writeError(w, http.StatusBadRequest, "invalid_token", "Invalid pagination token")
			return
		}
		after = n
	}
	var fs []filter
	if v, ok := queryJSON(r, "select_filters"); ok {
		q, isObj := v.(map[string]any)
		if !isObj {
			writeError(w, http.StatusBadRequest, "invalid_request", "select_filters must be a JSON object")
			return
		}
		var err error
		fs, err = parseFilters(q, func(f string) bool { return f != "dph_total" && f != "num_gpus" })
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error()+" (computed fields cannot be filtered)")
			return
		}
	}
	s.mu.Lock()
	ids := make([]int64, 0, len(s.instances))
	for id, in := range s.instances {
		if !in.destroyed {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var all []map[string]any
	for _, id := range ids {
		if row := s.instanceJSON(s.instances[id]); matches(toRow(row), fs) {
			all = append(all, row)
		}
	}
	s.mu.Unlock()
	counts := map[string]int{}
	var page []map[string]any
	more := false
	for _, row := range all {
		l, _ := row["label"].(string)
		counts[l]++
		if row["id"].(int64) <= after {
			continue
		}
		if len(page) == limit {
			more = true
			continue
		}
		page = append(page, row)
	}
	var next any
	if more {
		next = "tok_" + strconv.FormatInt(page[len(page)-1]["id"].(int64), 36)
	}
	if page == nil {
		page = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "instances_found": len(page),
		"total_instances": len(all), "label_counts": counts, "next_token": next, "instances": page})
}

// listInstancesV0 answers the deprecated GET /api/v0/instances/.
func (s *Server) listInstancesV0(w http.ResponseWriter, _ *http.Request, _ []byte, _ int64) {
	s.mu.Lock()
	rows := []map[string]any{}
	for _, in := range s.sortedInstances() {
		if !in.destroyed {
			rows = append(rows, s.instanceJSON(in))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"instances_found": len(rows), "instances": rows})
}

// sortedInstances lists every instance by id; s.mu must be held.
func (s *Server) sortedInstances() []*instance {
	out := make([]*instance, 0, len(s.instances))
	for _, in := range s.instances {
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// destroyInstance answers DELETE /api/v0/instances/{id}/; the machine's
// offer comes back to the market under a new ask id.
func (s *Server) destroyInstance(w http.ResponseWriter, _ *http.Request, _ []byte, id int64) {
	s.mu.Lock()
	in, err := s.lookup(id)
	if err != nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "not_found", "Instance not found")
		return
	}
	in.destroyed, in.destroyedAt = true, s.now()
	in.stopInference()
	if o := s.offers[in.offer.ID]; o != nil && o.Rented {
		relisted := *o
		relisted.ID, relisted.AskContractID, relisted.Rented = s.nextOffer, s.nextOffer, false
		s.nextOffer++
		delete(s.offers, o.ID)
		s.offers[relisted.ID] = &relisted
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "msg": fmt.Sprintf("destroying instance %d.", id)})
}

// manageInstance answers PUT /api/v0/instances/{id}/ with {"state":...} or
// {"label":...}.
func (s *Server) manageInstance(w http.ResponseWriter, _ *http.Request, body []byte, id int64) {
	var req struct {
		State *string `json:"state"`
		Label *string `json:"label"`
	}
	if json.Unmarshal(body, &req) != nil || (req.State == nil && req.Label == nil) {
		writeError(w, http.StatusBadRequest, "invalid_args", "expected state or label")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.lookup(id)
	if err != nil {
		writeError(w, http.StatusNotFound, "no_such_instance", fmt.Sprintf("Instance %d not found.", id))
		return
	}
	if req.Label != nil {
		if len(*req.Label) > 1024 {
			writeError(w, http.StatusBadRequest, "label_too_long", "label is longer than 1024 characters")
			return
		}
		in.label = *req.Label
		writeJSON(w, http.StatusOK, map[string]any{"success": true,
			"msg": fmt.Sprintf("label for %d set to '%s'", id, in.label)})
		return
	}
	switch *req.State {
	case "stopped":
		in.intended = "stopped"
	case "running":
		if in.intended != "running" {
			in.intended, in.phaseStart = "running", s.now()
		}
	default:
		writeError(w, http.StatusBadRequest, "invalid_args", "state must be running or stopped")
		return
	}
	s.status(in)
	writeJSON(w, http.StatusOK, map[string]any{"success": true})
}
