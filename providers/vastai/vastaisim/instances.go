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
	Endpoint    string  // inference base URL while running, else ""
	DPHTotal    float64 // USD/hour while running: GPU (or the bid) plus storage
	IsBid       bool
	Bid         float64 // USD/hour of a bid instance's GPU time
	Paused      bool    // outranked by someone else (Options.Market); resumes by itself
	Preemptions int     // times it was paused
	StatusMsg   string  // status_msg
	Charged     float64 // USD charged so far (what the charges endpoint reports, unrounded)
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
	bid         float64   // USD/hour of a bid instance's GPU time
	created     time.Time // start_date; storage bills from here to destroy
	phaseStart  time.Time // start of the current null → loading → running run
	intended    string    // "running" or "stopped"
	runFrom     time.Time // when the current run's GPU billing starts; zero while stopped
	runs        []span    // past runs' GPU billing
	forced      string    // actual_status set by SetInstanceStatus
	statusMsg   string
	inf         *InferenceServer
	destroyed   bool
	destroyedAt time.Time
	// paused: meant to run, but someone else holds its GPUs at a higher
	// priority (Options.Market); it resumes by itself.
	paused      bool
	preemptions int       // times it was paused
	rebootEnd   time.Time // "rebooting" until then
	events      []logLine // what the logs endpoint reports
}

// logLine is one line of an instance's logs.
type logLine struct {
	at     time.Time
	daemon bool // the host daemon's line, not the container's
	text   string
}

// maxLogLines bounds an instance's kept log lines.
const maxLogLines = 1000

// logf appends a log line at t.
func (in *instance) logf(t time.Time, daemon bool, format string, args ...any) {
	if len(in.events) >= maxLogLines {
		in.events = in.events[1:]
	}
	in.events = append(in.events, logLine{at: t, daemon: daemon, text: fmt.Sprintf(format, args...)})
}

// span is a period of GPU billing at a rate (USD/hour).
type span struct {
	from, to time.Time
	rate     float64
}

// startRun makes in run from now: it reaches "running" after StartDelay,
// when its GPU time starts to bill.
func (s *Server) startRun(in *instance, now time.Time) {
	in.intended, in.phaseStart, in.runFrom = "running", now, now.Add(s.opts.StartDelay)
}

// stopRun stops in at now, ending its GPU billing (storage goes on).
func (in *instance) stopRun(now time.Time) {
	in.intended = "stopped"
	in.endRun(now)
}

// endRun closes the current run's GPU billing at now.
func (in *instance) endRun(now time.Time) {
	if in.runFrom.IsZero() {
		return
	}
	if now.After(in.runFrom) {
		in.runs = append(in.runs, span{in.runFrom, now, in.gpuRate()})
	}
	in.runFrom = time.Time{}
}

// gpuRate is what an hour of GPU time costs: the bid, or dph_base.
func (in *instance) gpuRate() float64 {
	if in.isBid {
		return in.bid
	}
	return in.offer.DPHBase
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
	case in.intended == "stopped", in.paused:
		st = "stopped"
	case s.now().Before(in.rebootEnd):
		st = "rebooting"
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
		in.logf(s.now(), false, "container started; inference server listening on port %d", inf.Port())
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
	if in.intended == "stopped" || in.paused {
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
		"dph_total": in.gpuRate() + o.StorageTotalCost, "dph_base": o.DPHBase, "storage_cost": o.StorageCost,
		"storage_total_cost": o.StorageTotalCost, "is_bid": in.isBid, "min_bid": o.MinBid,
		"public_ipaddr": "127.0.0.1", "local_ipaddrs": "127.0.0.1",
		"ssh_host": "127.0.0.1", "ssh_port": 20000 + int(in.id%10000), "ssh_idx": "5",
		"ports": ports, "direct_port_start": -1, "direct_port_end": -1, "direct_port_count": o.DirectPortCount,
		"start_date": start, "end_date": start + o.Duration, "duration": o.Duration, "uptime_mins": uptime,
		"reliability2": o.Reliability2, "geolocation": o.Geolocation, "verification": o.Verification,
		"static_ip": o.StaticIP, "rentable": true, "external": false, "time_remaining": "", "volume_info": []any{},
	}
}

// createRequest is the PUT /asks/{id}/ body. The official client also sends
// image_login, python_utf8, lang_utf8, use_jupyter_lab, jupyter_dir,
// extra, force, user, args and volume_info, which the simulator accepts
// and ignores.
type createRequest struct {
	ClientID       string          `json:"client_id"`
	Image          string          `json:"image"`
	TemplateHashID string          `json:"template_hash_id"`
	Disk           *float64        `json:"disk"`
	Label          string          `json:"label"`
	Env            json.RawMessage `json:"env"`
	Runtype        string          `json:"runtype"`
	Onstart        string          `json:"onstart"`
	// Price is a bid in USD/hour: the instance is interruptible and its GPU
	// time bills at the bid.
	Price *float64 `json:"price"`
	// CancelUnavail refuses (410 no_such_ask) a create whose machine is
	// taken instead of leaving a stopped instance; when absent it is true
	// for an on-demand create meant to run, false for bids (vast.ai's
	// documented defaults). The official CLI sends false unless told.
	CancelUnavail *bool `json:"cancel_unavail"`
	// TargetState is "running" (the default) or "stopped".
	TargetState string `json:"target_state"`
	// Type ("on-demand", "bid", "interruptible", ...) is accepted and
	// ignored: as on vast.ai, a price is what makes a bid.
	Type json.RawMessage `json:"type"`
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

// defaultDiskGB is the disk of a create that sets none, and the least one
// may set (vast.ai's guide: minimum and default 8 GB).
const defaultDiskGB = 8.0

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
	if strings.TrimSpace(req.Image) == "" && req.TemplateHashID != "" {
		// The template would supply the image; the simulator has no
		// templates, so it names the image after it.
		req.Image = "template/" + req.TemplateHashID
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
	case req.Disk != nil && *req.Disk < defaultDiskGB:
		bad("invalid_args", fmt.Sprintf("disk must be at least %g GB", defaultDiskGB))
		return
	case req.Price != nil && (*req.Price < 0.001 || *req.Price > 128):
		bad("invalid_price", "price must be between 0.001 and 128")
		return
	case req.TargetState != "" && req.TargetState != "running" && req.TargetState != "stopped":
		bad("invalid_args", fmt.Sprintf("target_state must be running or stopped, got %q", req.TargetState))
		return
	}
	disk := defaultDiskGB
	if req.Disk != nil {
		disk = *req.Disk
	}
	cancelUnavail := req.TargetState != "stopped" && req.Price == nil
	if req.CancelUnavail != nil {
		cancelUnavail = *req.CancelUnavail
	}
	s.mu.Lock()
	now := s.now()
	s.settleChurn(now)
	o := s.offers[askID]
	_, taken := s.taken[askID]
	switch {
	case o == nil:
		s.mu.Unlock()
		writeJSON(w, http.StatusNotFound, map[string]any{"success": false, "error": "invalid_args",
			"msg": fmt.Sprintf("error 404/3603: no_such_ask Instance type by id %d is not available.", askID), "ask_id": askID})
		return
	case o.Rented || !o.Rentable || (taken && cancelUnavail):
		s.mu.Unlock()
		writeJSON(w, http.StatusGone, map[string]any{"success": false, "error": "no_such_ask",
			"msg": fmt.Sprintf("error 410/3907: no_such_ask Instance type %d is no longer available.", askID), "ask_id": askID})
		return
	case disk > o.DiskSpace:
		s.mu.Unlock()
		bad("invalid_args", fmt.Sprintf("disk %g GB exceeds the %g GB available", disk, o.DiskSpace))
		return
	}
	if taken {
		// Someone else holds the GPUs and the caller did not ask to cancel:
		// the instance is created stopped, as vast.ai does. It keeps the
		// machine from now on (the simulator does not model waiting for it).
		delete(s.taken, askID)
	}
	o.Rented = true
	minBid := o.MinBid
	in := &instance{
		id: s.nextInstance, offer: o.priced(disk), label: req.Label, image: req.Image,
		runtype: req.Runtype, onstart: req.Onstart, env: env, disk: disk, isBid: req.Price != nil,
		created: now,
	}
	if in.isBid {
		in.bid = *req.Price
	}
	if in.runtype == "" {
		in.runtype = "ssh"
	}
	s.nextInstance++
	s.created++
	s.instances[in.id] = in
	s.startRun(in, now)
	in.logf(now, true, "instance %d created on machine %d: pulling %s", in.id, o.MachineID, in.image)
	lowBid := req.Price != nil && *req.Price < o.MinBid
	mode, ambiguous := s.faults.takeAmbiguous()
	switch {
	case taken:
		in.stopRun(now)
		in.statusMsg = "created stopped: the machine is rented by another client (cancel_unavail is false)"
	case lowBid && s.mkt != nil:
		// Below the minimum bid the instance exists but waits, paused,
		// until its bid wins the machine (the minimum bid walks down).
		s.settleOne(in, now)
	case lowBid, req.TargetState == "stopped", ambiguous && mode == AmbiguousStopped:
		in.stopRun(now)
	}
	if s.mkt != nil {
		s.keepFloor()
	}
	s.mu.Unlock()

	switch {
	case lowBid: // the bid is too low: the instance exists, stopped, yet the reply is an error
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "error": "invalid_price",
			"msg":          fmt.Sprintf("bid %g is below the minimum %g; instance created stopped", *req.Price, minBid),
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
	now := s.now()
	in.endRun(now)
	in.destroyed, in.destroyedAt = true, now
	in.stopInference()
	if o := s.offers[in.offer.ID]; o != nil && o.Rented {
		s.relist(o.ID)
	}
	if s.mkt != nil {
		// The machine is free again: whoever outranked us keeps it only
		// as a listed offer would be kept, so the claim ends here.
		delete(s.mkt.claims, in.offer.MachineID)
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
	now := s.now()
	switch *req.State {
	case "stopped":
		in.stopRun(now)
		in.paused = false
		in.logf(now, true, "instance %d stopped", in.id)
	case "running":
		if in.intended != "running" {
			s.startRun(in, now)
			in.logf(now, true, "instance %d starting", in.id)
			if s.mkt != nil {
				// A stopped instance gave up its GPUs: if someone took
				// them meanwhile, it waits until they leave.
				s.settleOne(in, now)
			}
		}
	default:
		writeError(w, http.StatusBadRequest, "invalid_args", "state must be running or stopped")
		return
	}
	s.status(in)
	writeJSON(w, http.StatusOK, map[string]any{"success": true})
}
