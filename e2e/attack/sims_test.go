package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// The simulators are read through their own APIs, in the providers' wire
// formats (vast.ai: GET /api/v1/instances/ in pages of 25 with
// after_token; io.net: GET caas/deployments in zero-based pages), as a
// reconciler of our own would — what the providers say is running.

// providerInstance is one instance as its provider lists it.
type providerInstance struct {
	provider string
	id       string
	tag      string // vast.ai label / io.net resource_private_name (list "name")
	status   string // vast.ai actual_status ("" for null) / io.net status
	// vast.ai only: the machine it runs on (one rental per machine) and
	// what it is, as the provider says.
	machine int64
	gpuName string
	numGPUs int
}

// live reports whether the provider is (or may soon be) running it.
func (p providerInstance) live() bool {
	if p.provider == "vast.ai" {
		return p.status != "stopped" // the v1 list leaves destroyed instances out; a stopped one keeps its disk
	}
	return p.status == "running" || p.status == "deployment requested"
}

func getJSON(ctx context.Context, u string, hdr map[string]string, dst any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return json.Unmarshal(b, dst)
}

// listVastAI pages through every live vast.ai instance.
func listVastAI(ctx context.Context, env simEnv) ([]providerInstance, error) {
	hdr := map[string]string{"Authorization": "Bearer " + env["VASTAI_API_KEY"]}
	var out []providerInstance
	after := ""
	for page := 0; page < 10_000; page++ {
		q := url.Values{"limit": {"25"}}
		if after != "" {
			b, _ := json.Marshal(after)
			q.Set("after_token", string(b))
		}
		var p struct {
			Instances []struct {
				ID           int64   `json:"id"`
				Label        *string `json:"label"`
				ActualStatus *string `json:"actual_status"`
				MachineID    int64   `json:"machine_id"`
				GPUName      string  `json:"gpu_name"`
				NumGPUs      int     `json:"num_gpus"`
			} `json:"instances"`
			NextToken *string `json:"next_token"`
		}
		if err := getJSON(ctx, strings.TrimRight(env["VASTAI_BASE_URL"], "/")+"/api/v1/instances/?"+q.Encode(), hdr, &p); err != nil {
			return nil, err
		}
		for _, in := range p.Instances {
			pi := providerInstance{provider: "vast.ai", id: strconv.FormatInt(in.ID, 10), machine: in.MachineID,
				gpuName: in.GPUName, numGPUs: in.NumGPUs}
			if in.Label != nil {
				pi.tag = *in.Label
			}
			if in.ActualStatus != nil {
				pi.status = *in.ActualStatus
			}
			out = append(out, pi)
		}
		if p.NextToken == nil || *p.NextToken == "" {
			return out, nil
		}
		after = *p.NextToken
	}
	return nil, fmt.Errorf("vast.ai instance list did not end")
}

// listIONet pages through every io.net deployment, whatever its status.
func listIONet(ctx context.Context, env simEnv) ([]providerInstance, error) {
	hdr := map[string]string{"X-API-KEY": env["IONET_API_KEY"]}
	base := strings.TrimRight(env["IONET_BASE_URL"], "/") + "/enterprise/v1/io-cloud/caas/deployments"
	var out []providerInstance
	for page := 0; page < 10_000; page++ {
		var p struct {
			Data struct {
				Deployments []struct {
					ID     string `json:"id"`
					Status string `json:"status"`
					Name   string `json:"name"`
				} `json:"deployments"`
				Total int `json:"total"`
			} `json:"data"`
		}
		if err := getJSON(ctx, fmt.Sprintf("%s?page=%d&page_size=100", base, page), hdr, &p); err != nil {
			return nil, err
		}
		for _, d := range p.Data.Deployments {
			out = append(out, providerInstance{provider: "io.net", id: d.ID, tag: d.Name, status: strings.ToLower(d.Status)})
		}
		if len(p.Data.Deployments) == 0 || len(out) >= p.Data.Total {
			return out, nil
		}
	}
	return nil, fmt.Errorf("io.net deployment list did not end")
}

// checkProviders: every provider instance is tracked by a row of ours
// (tag = our id), running ones by a running, billed row; nothing runs at a
// provider that our rows think is gone; every running row runs there.
func (s *dbState) checkProviders(v *violations, pis []providerInstance) (live int) {
	seen := map[string]providerInstance{}
	for _, pi := range pis {
		in := s.instances[pi.tag]
		if pi.live() {
			live++
		}
		switch {
		case in == nil:
			if pi.live() {
				v.add("untracked: %s instance %s (tag %q, %s) has no row of ours", pi.provider, pi.id, pi.tag, pi.status)
			}
			continue
		case in.provider != pi.provider:
			v.add("%s instance %s carries tag %s of a %s row", pi.provider, pi.id, in.id, in.provider)
			continue
		case in.providerID != "" && in.providerID != pi.id:
			v.add("two provider instances for row %s: %s (recorded) and %s (tag %s, %s)", in.id, in.providerID, pi.id, pi.tag, pi.status)
			continue
		}
		seen[in.id] = pi
		if pi.live() && in.status != "running" {
			v.add("running at %s but %s here: %s instance %s, row %s", pi.provider, in.status, pi.provider, pi.id, in.id)
		}
		if !pi.live() && in.status == "running" {
			v.add("row %s is running but %s reports instance %s %s", in.id, pi.provider, pi.id, pi.status)
		}
	}
	for _, in := range s.instances {
		if in.status != "running" {
			continue
		}
		if _, ok := seen[in.id]; !ok {
			v.add("row %s (%s %s) is running but its provider lists no instance tagged with it", in.id, in.provider, in.providerID)
		}
	}
	return live
}
