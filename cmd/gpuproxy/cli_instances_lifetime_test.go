package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/apiview"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/internal/teststack"
)

// instancesCmd runs `instances args…` with the world's environment.
func (w *instancesWorld) instancesCmd(args ...string) (string, error) {
	w.t.Helper()
	var out bytes.Buffer
	err := cmdInstances(context.Background(), args, envFunc(w.env), &out, &bytes.Buffer{})
	return out.String(), err
}

// instance reads an instance's lifetime through the API.
func (w *instancesWorld) instance(id string) apiview.LifetimeJSON {
	w.t.Helper()
	r := teststack.Send(w.t, http.MethodGet, w.env["GPUPROXY_URL"]+"/api/v1/gpu/instances/"+id, nil,
		"X-API-Key", w.env["GPUPROXY_API_KEY"])
	var l apiview.LifetimeJSON
	if err := json.Unmarshal(r.Body, &l); err != nil || r.Status != http.StatusOK {
		w.t.Fatalf("instance %s: %d %s", id, r.Status, r.Body)
	}
	return l
}

// TestInstancesLifetime: `instances create` takes the lifetime flags and
// prints the rules; `instances update ID` changes them and
// `instances keepalive ID` moves the last activity, both checked through
// the API.
func TestInstancesLifetime(t *testing.T) {
	w := newInstancesWorld(t)
	out, errOut, err := w.create(nil, "--gpu", "4090", "--max-price", "1", "--image", "img", "--idle-timeout", "20m",
		"--idle-grace", "0s", "--max-duration", "8h", "--spend-cap", "5.5", "--idle-action", "destroy")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	t.Logf("create:\n%s", out)
	m := rentedRE.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "\nlifetime: idle_timeout 20m0s (destroy, grace 0s), max_duration 8h0m0s, spend_cap $5.50\nnext: ") {
		t.Fatalf("create output:\n%s", out)
	}
	id := m[1]
	if l := w.instance(id); l.IdleTimeout != "20m0s" || l.MaxDuration != "8h0m0s" || l.SpendCap != 5_500_000 || l.IdleAction != "destroy" {
		t.Fatalf("the instance's rules: %+v", l)
	}

	out, err = w.instancesCmd("update", id, "--idle-timeout", "10m", "--spend-cap", "0")
	if err != nil || !strings.HasPrefix(out, "updated "+id+": idle_timeout 10m0s (destroy, grace 0s), max_duration 8h0m0s\n") {
		t.Fatalf("update: %v\n%s", err, out)
	}
	if l := w.instance(id); l.IdleTimeout != "10m0s" || l.SpendCap != 0 || l.MaxDuration != "8h0m0s" {
		t.Fatalf("after update: %+v", l)
	}

	before := time.Now().Add(-time.Millisecond)
	out, err = w.instancesCmd("keepalive", id)
	if err != nil || !regexp.MustCompile(`^kept `+id+` alive: last activity \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; its idle timeout starts over\nnext: `).MatchString(out) {
		t.Fatalf("keepalive: %v\n%s", err, out)
	}
	if l := w.instance(id); l.LastActivityAt == nil || l.LastActivityAt.Before(before) {
		t.Fatalf("last activity after keepalive: %v, want at or after %v", l.LastActivityAt, before)
	}
}

// TestInstancesLifetimeErrors: the lifetime errors, the CLI's own and the
// API's, name the flag; an update past the account's policy says so.
func TestInstancesLifetimeErrors(t *testing.T) {
	w := newInstancesWorld(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle-timeout", "soon"}, `--idle-timeout: give a duration such as 30m, 8h or 90s (0 for none), got "soon"`},
		{[]string{"--max-duration", "8 hours"}, `--max-duration: give a duration`},
		{[]string{"--idle-grace", "-1m"}, `--idle-grace: must be a duration such as "30s" or "8h", from 0s to 24h, got "-1m"`},
		{[]string{"--idle-timeout", "5s"}, `--idle-timeout: must be a duration such as "30s" or "8h", from 10s to 720h, or "0" for none, got "5s"`},
		{[]string{"--idle-action", "sleep"}, `--idle-action: must be "stop" or "destroy", got "sleep"`},
		{[]string{"--spend-cap", "lots"}, `--spend-cap: give US dollars, e.g. 20 or 0 for none (got "lots")`},
		{[]string{"--spend-cap", "-1"}, `--spend-cap: give US dollars`},
	} {
		_, _, err := w.create(nil, append([]string{"--gpu", "4090", "--max-price", "1", "--image", "img"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create %v: %v\nwant %q", tc.args, err, tc.want)
		}
	}
	if n := w.vast.CountRequests(http.MethodPut, "/api/v0/asks"); n != 0 {
		t.Fatalf("%d creates sent", n)
	}

	ctx := context.Background()
	st, err := db.Open(ctx, db.Options{URL: w.env["DATABASE_URL"]})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	acct, err := st.AccountByName(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Hour
	if err := st.SetLifetimePolicy(ctx, acct.ID, gpuproxy.LifetimePolicy{MaxIdleTimeout: &hour}); err != nil {
		t.Fatal(err)
	}
	out, _, err := w.create(nil, "--gpu", "4090", "--max-price", "1", "--image", "img")
	m := rentedRE.FindStringSubmatch(out)
	if err != nil || m == nil || !strings.Contains(out, "lifetime: idle_timeout 1h0m0s") {
		t.Fatalf("create under the policy: %v\n%s", err, out)
	}
	id := m[1]
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"update", id, "--idle-timeout", "2h"}, "--idle-timeout: must be at most 1h0m0s (the account's max_idle_timeout), got 2h0m0s"},
		{[]string{"update", id, "--idle-timeout", "0"}, "--idle-timeout: the account's policy requires one"},
		{[]string{"update", id, "--idle-action", "nap"}, `--idle-action: must be "stop" or "destroy"`},
		{[]string{"update", id}, "give at least one of --max-duration, --idle-timeout"},
		{[]string{"update", id, "--image", "img"}, "--image: not a flag of instances update"},
		{[]string{"update", "--idle-timeout", "20m"}, "usage: gpuproxy instances update ID"},
		{[]string{"update", "gpi_nope", "--idle-timeout", "20m"}, `instance "gpi_nope" not found`},
		{[]string{"keepalive"}, "usage: gpuproxy instances keepalive ID"},
		{[]string{"keepalive", id, "--idle-timeout", "20m"}, "--idle-timeout: not a flag of instances keepalive"},
		{[]string{"keepalive", "gpi_nope"}, `instance "gpi_nope" not found`},
	} {
		_, err := w.instancesCmd(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v\nwant %q", tc.args, err, tc.want)
		}
	}
	if l := w.instance(id); l.IdleTimeout != "1h0m0s" || l.LastActivityAt != nil {
		t.Fatalf("refused updates changed the instance: %+v", l)
	}
}
