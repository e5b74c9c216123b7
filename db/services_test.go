package db_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/services"
)

var _ services.Store = (*db.Store)(nil)

// fullService returns a service of the account with every field set.
func fullService(acct int64, id, name, model string) gpuproxy.Service {
	return gpuproxy.Service{ID: id, AccountID: acct, Name: name, Model: model, KeyID: "key_" + id,
		Spec:  json.RawMessage(`{"gpu":"H100","min_vram_gb":80,"num_gpus":2,"max_price_per_hour":4.5,"providers":["vastai"]}`),
		Image: "vllm/vllm-openai:v0.6", Env: map[string]string{"HF_TOKEN": "hf_x", "MODEL": model}, Port: 8000,
		MinReplicas: 1, MaxReplicas: 4,
		Readiness:    gpuproxy.Readiness{Path: "/v1/models", Timeout: 3 * time.Second, InitialDelay: 90 * time.Second},
		Scale:        gpuproxy.ScalePolicy{TargetInflight: 8, UpDelay: 30 * time.Second, DownDelay: 5 * time.Minute},
		QueueTimeout: 30 * time.Second,
		Lifetime: gpuproxy.Lifetime{MaxDuration: 24 * time.Hour, IdleTimeout: 20 * time.Minute,
			IdleAction: gpuproxy.IdleDestroy, IdleGrace: 10 * time.Minute, SpendCap: 50 * usd},
		Desired: 1, DemandAt: t0.Add(-time.Minute), CreatedAt: t0}
}

func mustService(t *testing.T, s *db.Store, svc gpuproxy.Service) gpuproxy.Service {
	t.Helper()
	out, err := s.CreateService(context.Background(), svc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameService fails unless got is want (times compared as instants).
func sameService(t *testing.T, what string, got, want gpuproxy.Service) {
	t.Helper()
	for _, p := range []struct{ g, w *time.Time }{{&got.DemandAt, &want.DemandAt}, {&got.CreatedAt, &want.CreatedAt},
		{&got.UpdatedAt, &want.UpdatedAt}, {&got.DeletedAt, &want.DeletedAt}} {
		if !p.g.Equal(*p.w) {
			t.Fatalf("%s: time %v, want %v", what, *p.g, *p.w)
		}
		*p.g, *p.w = time.Time{}, time.Time{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// wantConflictOn fails unless err is a conflict naming field.
func wantConflictOn(t *testing.T, err error, field string) {
	t.Helper()
	if gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT || gpuproxy.ErrorDetails(err)["field"] != field {
		t.Fatalf("want a conflict naming %q, got %v (details %v)", field, err, gpuproxy.ErrorDetails(err))
	}
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		t.Fatalf("%s: want not found, got %v", what, err)
	}
}

// TestServiceRoundTrip: every field is stored and read back by each
// reader; an update replaces the settings and keeps the rest; desired,
// demand and state move as documented.
func TestServiceRoundTrip(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "svc")
		want := fullService(a.ID, "svc_1", "chat", "llama-3-70b")
		got := mustService(t, s, want)
		want.State, want.UpdatedAt = gpuproxy.ServiceActive, t0
		sameService(t, "created", got, want)
		want = fullService(a.ID, "svc_1", "chat", "llama-3-70b")
		want.State, want.UpdatedAt = gpuproxy.ServiceActive, t0

		for _, key := range []string{"svc_1", "chat"} {
			got, err := s.Service(ctx, a.ID, key)
			if err != nil {
				t.Fatal(err)
			}
			sameService(t, "by "+key, got, want)
		}
		if got, err := s.ServiceByID(ctx, "svc_1"); err != nil {
			t.Fatal(err)
		} else {
			sameService(t, "by id", got, want)
		}
		list, err := s.Services(ctx, a.ID)
		if err != nil || len(list) != 1 {
			t.Fatalf("services = %v, %v", list, err)
		}
		sameService(t, "listed", list[0], want)

		// A minimal service: empty env and spec read back as nil and {}.
		bare := gpuproxy.Service{ID: "svc_0", AccountID: a.ID, Name: "bare", Model: "tiny", CreatedAt: t0.Add(-time.Hour)}
		got = mustService(t, s, bare)
		if got.Env != nil || string(got.Spec) != "{}" || got.KeyID != "" || !got.DemandAt.IsZero() || got.State != gpuproxy.ServiceActive {
			t.Fatalf("bare service = %+v", got)
		}
		live, err := s.LiveServices(ctx)
		if err != nil || len(live) != 2 || live[0].ID != "svc_0" || live[1].ID != "svc_1" {
			t.Fatalf("live services (oldest first) = %v, %v", live, err)
		}
		if list, _ := s.Services(ctx, a.ID); len(list) != 2 || list[0].Name != "bare" || list[1].Name != "chat" {
			t.Fatalf("services by name = %v", list)
		}

		// Update: every setting replaced; id, account, name, key, state,
		// demand and creation kept whatever the caller passes.
		up := gpuproxy.Service{ID: "svc_1", AccountID: a.ID, Name: "renamed", Model: "llama-3-8b", KeyID: "key_other",
			Spec: json.RawMessage(`{"gpu":"A100"}`), Image: "vllm:v2", Env: map[string]string{"A": "b"}, Port: 9000,
			MinReplicas: 0, MaxReplicas: 2,
			Readiness:    gpuproxy.Readiness{Path: "/health", Timeout: time.Second, InitialDelay: time.Minute},
			Scale:        gpuproxy.ScalePolicy{TargetInflight: 2, UpDelay: time.Minute, DownDelay: time.Hour},
			QueueTimeout: 5 * time.Second,
			Lifetime: gpuproxy.Lifetime{MaxDuration: time.Hour, IdleTimeout: time.Minute, IdleAction: gpuproxy.IdleStop,
				IdleGrace: time.Second, SpendCap: 7},
			Desired: 2, State: gpuproxy.ServiceDeleted, DemandAt: t0.Add(time.Hour), CreatedAt: t0.Add(time.Hour),
			UpdatedAt: t0.Add(time.Minute)}
		got, err = s.UpdateService(ctx, up)
		if err != nil {
			t.Fatal(err)
		}
		wantUp := up
		wantUp.Name, wantUp.KeyID, wantUp.State = "chat", "key_svc_1", gpuproxy.ServiceActive
		wantUp.DemandAt, wantUp.CreatedAt = want.DemandAt, t0
		sameService(t, "updated", got, wantUp)
		if got, _ := s.Service(ctx, a.ID, "chat"); got.Model != "llama-3-8b" || got.Port != 9000 {
			t.Fatalf("update not stored: %+v", got)
		}
		if _, err := s.UpdateService(ctx, gpuproxy.Service{ID: "svc_nope", AccountID: a.ID, Model: "x", UpdatedAt: t0}); err == nil {
			t.Fatal("updating a missing service succeeded")
		} else {
			wantNotFound(t, "update missing", err)
		}
		if _, err := s.UpdateService(ctx, gpuproxy.Service{ID: "svc_1", AccountID: a.ID, Model: "m"}); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("update without UpdatedAt: %v", err)
		}
		if _, err := s.CreateService(ctx, gpuproxy.Service{ID: "svc_j", AccountID: a.ID, Name: "j", Model: "j",
			Spec: json.RawMessage(`{"gpu":`), CreatedAt: t0}); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("bad spec JSON: %v", err)
		}
		if _, err := s.CreateService(ctx, gpuproxy.Service{ID: "svc_1", AccountID: a.ID, Name: "x", Model: "x",
			CreatedAt: t0}); err == nil {
			t.Fatal("a duplicate id was stored")
		} else {
			wantConflictOn(t, err, "id")
		}

		// Desired size and demand.
		if err := s.SetServiceDesired(ctx, "svc_1", 3, t0.Add(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		wantNotFound(t, "desired of a missing service", s.SetServiceDesired(ctx, "svc_nope", 1, t0))
		for _, at := range []time.Time{t0.Add(5 * time.Minute), t0.Add(3 * time.Minute)} {
			if err := s.NoteServiceDemand(ctx, "svc_1", at); err != nil {
				t.Fatal(err)
			}
		}
		wantNotFound(t, "demand of a missing service", s.NoteServiceDemand(ctx, "svc_nope", t0))
		got, _ = s.ServiceByID(ctx, "svc_1")
		if got.Desired != 3 || !got.UpdatedAt.Equal(t0.Add(2*time.Minute)) || !got.DemandAt.Equal(t0.Add(5*time.Minute)) {
			t.Fatalf("desired/demand = %d %v %v", got.Desired, got.UpdatedAt, got.DemandAt)
		}

		// State: deleting stays live; deleted leaves every list, keeps its
		// first DeletedAt, and never comes back.
		got, err = s.SetServiceState(ctx, "svc_1", gpuproxy.ServiceDeleting, t0.Add(10*time.Minute))
		if err != nil || got.State != gpuproxy.ServiceDeleting || !got.DeletedAt.IsZero() {
			t.Fatalf("deleting = %+v, %v", got, err)
		}
		if live, _ := s.LiveServices(ctx); len(live) != 2 {
			t.Fatalf("a deleting service left the live list: %v", live)
		}
		got, err = s.SetServiceState(ctx, "svc_1", gpuproxy.ServiceDeleted, t0.Add(11*time.Minute))
		if err != nil || got.State != gpuproxy.ServiceDeleted || !got.DeletedAt.Equal(t0.Add(11*time.Minute)) {
			t.Fatalf("deleted = %+v, %v", got, err)
		}
		got, err = s.SetServiceState(ctx, "svc_1", gpuproxy.ServiceDeleted, t0.Add(12*time.Minute))
		if err != nil || !got.DeletedAt.Equal(t0.Add(11*time.Minute)) {
			t.Fatalf("deleted again = %+v, %v", got, err)
		}
		if _, err := s.SetServiceState(ctx, "svc_1", gpuproxy.ServiceActive, t0.Add(13*time.Minute)); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("a deleted service came back: %v", err)
		}
		if _, err := s.SetServiceState(ctx, "svc_nope", gpuproxy.ServiceDeleting, t0); err == nil {
			t.Fatal("state of a missing service")
		} else {
			wantNotFound(t, "state of a missing service", err)
		}
		if _, err := s.SetServiceState(ctx, "svc_0", "paused", t0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("unknown state: %v", err)
		}
		_, err = s.Service(ctx, a.ID, "chat")
		wantNotFound(t, "deleted by name", err)
		_, err = s.Service(ctx, a.ID, "svc_1")
		wantNotFound(t, "deleted by id", err)
		if got, err := s.ServiceByID(ctx, "svc_1"); err != nil || got.State != gpuproxy.ServiceDeleted {
			t.Fatalf("deleted by ServiceByID = %+v, %v", got, err)
		}
		if _, err := s.UpdateService(ctx, up); err == nil {
			t.Fatal("a deleted service was updated")
		} else {
			wantNotFound(t, "update deleted", err)
		}
		if list, _ := s.Services(ctx, a.ID); len(list) != 1 || list[0].ID != "svc_0" {
			t.Fatalf("services after delete = %v", list)
		}
		if live, _ := s.LiveServices(ctx); len(live) != 1 || live[0].ID != "svc_0" {
			t.Fatalf("live services after delete = %v", live)
		}
	})
}

// TestServiceConflicts: a name or model another live service of the
// account has is a conflict naming the field, on create and on update;
// another account, and a deleted service, are no conflict.
func TestServiceConflicts(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		b := mustAccount(t, s, "b")
		first := mustService(t, s, fullService(a.ID, "svc_1", "chat", "llama"))
		mustService(t, s, fullService(a.ID, "svc_2", "embed", "bge"))

		_, err := s.CreateService(ctx, fullService(a.ID, "svc_3", "chat", "other"))
		wantConflictOn(t, err, "name")
		_, err = s.CreateService(ctx, fullService(a.ID, "svc_3", "other", "llama"))
		wantConflictOn(t, err, "model")
		up := first
		up.Model, up.UpdatedAt = "bge", t0.Add(time.Minute)
		_, err = s.UpdateService(ctx, up)
		wantConflictOn(t, err, "model")
		// Its own model is no conflict.
		up.Model = "llama"
		if _, err := s.UpdateService(ctx, up); err != nil {
			t.Fatal(err)
		}
		// Another account may use both.
		mustService(t, s, fullService(b.ID, "svc_b1", "chat", "llama"))

		// A deleted service frees its name and model.
		if _, err := s.SetServiceState(ctx, "svc_1", gpuproxy.ServiceDeleted, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		again := mustService(t, s, fullService(a.ID, "svc_4", "chat", "llama"))
		if got, err := s.Service(ctx, a.ID, "chat"); err != nil || got.ID != again.ID {
			t.Fatalf("the name's new service = %+v, %v", got, err)
		}
		up.ID, up.Model = "svc_2", "llama"
		_, err = s.UpdateService(ctx, up)
		wantConflictOn(t, err, "model")
	})
}

// TestServiceAccountIsolation: another account's service is not found,
// not listed, not updated, and neither its replicas nor its events show.
func TestServiceAccountIsolation(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		b := mustAccount(t, s, "b")
		mustService(t, s, fullService(a.ID, "svc_a", "chat", "llama"))
		if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_a", InstanceID: "gpi_1", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: "svc_a", Kind: "service.created", At: t0}); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"svc_a", "chat"} {
			_, err := s.Service(ctx, b.ID, key)
			wantNotFound(t, "b reading a's service by "+key, err)
		}
		if list, err := s.Services(ctx, b.ID); err != nil || len(list) != 0 {
			t.Fatalf("b's services = %v, %v", list, err)
		}
		if reps, err := s.AccountReplicas(ctx, b.ID); err != nil || len(reps) != 0 {
			t.Fatalf("b's replicas = %v, %v", reps, err)
		}
		if reps, err := s.AccountReplicas(ctx, a.ID); err != nil || len(reps) != 1 || reps[0].AccountID != a.ID {
			t.Fatalf("a's replicas = %v, %v", reps, err)
		}
		if evs, err := s.ServiceEvents(ctx, b.ID, "svc_a", 10); err != nil || len(evs) != 0 {
			t.Fatalf("b's events of a's service = %v, %v", evs, err)
		}
		upd := fullService(b.ID, "svc_a", "chat", "stolen")
		upd.UpdatedAt = t0
		_, err := s.UpdateService(ctx, upd)
		wantNotFound(t, "b updating a's service", err)
		if got, _ := s.ServiceByID(ctx, "svc_a"); got.Model != "llama" {
			t.Fatalf("b changed a's service: %+v", got)
		}
		wantNotFound(t, "b adding a replica to a's service", s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_a",
			InstanceID: "gpi_2", AccountID: b.ID, CreatedAt: t0}))
		_, err = s.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: "svc_a", AccountID: b.ID, Kind: "x", At: t0})
		wantNotFound(t, "b adding an event to a's service", err)
	})
}

// TestServiceReplicas: ReadyAt and UnreadySince follow the documented
// rules; gone replicas leave the lists and never come back; the router's
// table holds only active services' replicas.
func TestServiceReplicas(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		mustService(t, s, fullService(a.ID, "svc_1", "chat", "llama"))
		mustService(t, s, fullService(a.ID, "svc_2", "embed", "bge"))
		for i, id := range []string{"gpi_b", "gpi_a", "gpi_c"} { // oldest first: b, a, c
			if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_1", InstanceID: id, AccountID: a.ID,
				CreatedAt: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_2", InstanceID: "gpi_e", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_1", InstanceID: "gpi_a", CreatedAt: t0}); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("a duplicate replica: %v", err)
		}
		wantNotFound(t, "replica of a missing service", s.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_nope",
			InstanceID: "gpi_x", CreatedAt: t0}))

		replica := func(id string) gpuproxy.Replica {
			t.Helper()
			reps, err := s.Replicas(ctx, "svc_1")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range reps {
				if r.InstanceID == id {
					return r
				}
			}
			t.Fatalf("replica %s not listed in %v", id, reps)
			return gpuproxy.Replica{}
		}
		set := func(id string, st gpuproxy.ReplicaState, reason string, at time.Duration) {
			t.Helper()
			if err := s.SetReplicaState(ctx, "svc_1", id, st, reason, t0.Add(at)); err != nil {
				t.Fatal(err)
			}
		}
		r := replica("gpi_a")
		if r.State != gpuproxy.ReplicaStarting || r.AccountID != a.ID || !r.ReadyAt.IsZero() || !r.UnreadySince.IsZero() ||
			!r.CreatedAt.Equal(t0.Add(time.Second)) || !r.UpdatedAt.Equal(r.CreatedAt) {
			t.Fatalf("new replica = %+v", r)
		}
		set("gpi_a", gpuproxy.ReplicaReady, "", time.Minute)
		if r = replica("gpi_a"); r.State != gpuproxy.ReplicaReady || !r.ReadyAt.Equal(t0.Add(time.Minute)) || !r.UnreadySince.IsZero() {
			t.Fatalf("ready = %+v", r)
		}
		set("gpi_a", gpuproxy.ReplicaUnready, "probe_failed", 2*time.Minute)
		set("gpi_a", gpuproxy.ReplicaUnready, "probe_failed", 3*time.Minute)
		if r = replica("gpi_a"); r.State != gpuproxy.ReplicaUnready || !r.UnreadySince.Equal(t0.Add(2*time.Minute)) ||
			!r.ReadyAt.Equal(t0.Add(time.Minute)) || r.Reason != "probe_failed" || !r.UpdatedAt.Equal(t0.Add(3*time.Minute)) {
			t.Fatalf("unready twice = %+v", r)
		}
		set("gpi_a", gpuproxy.ReplicaReady, "", 4*time.Minute)
		if r = replica("gpi_a"); !r.ReadyAt.Equal(t0.Add(4*time.Minute)) || !r.UnreadySince.IsZero() || r.Reason != "" {
			t.Fatalf("ready again = %+v", r)
		}
		set("gpi_c", gpuproxy.ReplicaDraining, "scale_down", 5*time.Minute)
		if r = replica("gpi_c"); r.State != gpuproxy.ReplicaDraining || r.Reason != "scale_down" || !r.ReadyAt.IsZero() {
			t.Fatalf("draining = %+v", r)
		}
		set("gpi_c", gpuproxy.ReplicaGone, "scale_down", 6*time.Minute)
		if err := s.SetReplicaState(ctx, "svc_1", "gpi_c", gpuproxy.ReplicaReady, "", t0.Add(7*time.Minute)); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("a gone replica came back: %v", err)
		}
		wantNotFound(t, "missing replica", s.SetReplicaState(ctx, "svc_1", "gpi_zz", gpuproxy.ReplicaReady, "", t0))
		if err := s.SetReplicaState(ctx, "svc_1", "gpi_a", "broken", "", t0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("unknown replica state: %v", err)
		}

		reps, err := s.Replicas(ctx, "svc_1")
		if err != nil || len(reps) != 2 || reps[0].InstanceID != "gpi_b" || reps[1].InstanceID != "gpi_a" {
			t.Fatalf("replicas (gone left, oldest first) = %v, %v", reps, err)
		}
		all, err := s.AccountReplicas(ctx, a.ID)
		if err != nil || len(all) != 3 {
			t.Fatalf("account replicas = %v, %v", all, err)
		}
		// A deleting service's replicas leave the router's table.
		if _, err := s.SetServiceState(ctx, "svc_2", gpuproxy.ServiceDeleting, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		all, err = s.AccountReplicas(ctx, a.ID)
		if err != nil || len(all) != 2 || all[0].ServiceID != "svc_1" || all[1].ServiceID != "svc_1" {
			t.Fatalf("account replicas with svc_2 deleting = %v, %v", all, err)
		}
		if reps, _ := s.Replicas(ctx, "svc_2"); len(reps) != 1 {
			t.Fatalf("a deleting service's replicas = %v", reps)
		}
	})
}

// TestServiceEvents: events come back newest first, at most limit, only
// for the service asked.
func TestServiceEvents(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		mustService(t, s, fullService(a.ID, "svc_1", "chat", "llama"))
		mustService(t, s, fullService(a.ID, "svc_2", "embed", "bge"))
		var added []gpuproxy.ServiceEvent
		for i := range 5 {
			e, err := s.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: "svc_1", AccountID: a.ID,
				Kind: fmt.Sprintf("service.k%d", i), InstanceID: fmt.Sprintf("gpi_%d", i), Message: fmt.Sprintf("m%d", i),
				At: t0.Add(time.Duration(i) * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if e.ID == 0 || e.AccountID != a.ID || e.Kind != fmt.Sprintf("service.k%d", i) || !e.At.Equal(t0.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("added event = %+v", e)
			}
			added = append(added, e)
		}
		if _, err := s.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: "svc_2", Kind: "service.created", At: t0.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		_, err := s.AddServiceEvent(ctx, gpuproxy.ServiceEvent{ServiceID: "svc_nope", Kind: "x", At: t0})
		wantNotFound(t, "event of a missing service", err)

		evs, err := s.ServiceEvents(ctx, a.ID, "svc_1", 3)
		if err != nil || len(evs) != 3 {
			t.Fatalf("events = %v, %v", evs, err)
		}
		for i, e := range evs {
			w := added[4-i]
			if e.ID != w.ID || e.Kind != w.Kind || e.InstanceID != w.InstanceID || e.Message != w.Message ||
				!e.At.Equal(w.At) || e.ServiceID != "svc_1" {
				t.Fatalf("event %d = %+v, want %+v", i, e, w)
			}
		}
		if evs, _ := s.ServiceEvents(ctx, a.ID, "svc_1", 0); len(evs) != 5 {
			t.Fatalf("events without a limit = %d, want 5", len(evs))
		}
	})
}

// TestServiceLoads: reports from two nodes are summed per service, stale
// ones left out, and a node's second report replaces its first.
func TestServiceLoads(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		report := func(node string, load map[string]int, at time.Duration) {
			t.Helper()
			if err := s.ReportServiceLoad(ctx, node, load, t0.Add(at)); err != nil {
				t.Fatal(err)
			}
		}
		loads := func(since time.Duration, want map[string]int) {
			t.Helper()
			got, err := s.ServiceLoads(ctx, t0.Add(since))
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("loads since %v = %v, %v; want %v", since, got, err, want)
			}
		}
		report("node-a", map[string]int{"svc_1": 3, "svc_2": 1}, 0)
		report("node-b", map[string]int{"svc_1": 2}, time.Second)
		loads(-10*time.Second, map[string]int{"svc_1": 5, "svc_2": 1})
		loads(time.Second, map[string]int{"svc_1": 2})
		// node-a reports svc_1 again: replaced, not added; its svc_2 report
		// stays as it was.
		report("node-a", map[string]int{"svc_1": 7}, 5*time.Second)
		loads(0, map[string]int{"svc_1": 9, "svc_2": 1})
		loads(2*time.Second, map[string]int{"svc_1": 7})
		loads(time.Minute, map[string]int{})
		// Zero and negative counts are reports too.
		report("node-b", map[string]int{"svc_1": -4}, 6*time.Second)
		loads(2*time.Second, map[string]int{"svc_1": 7})
		if err := s.ReportServiceLoad(ctx, "", map[string]int{"svc_1": 1}, t0); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("a report without a node: %v", err)
		}
	})
}

// TestServiceCreateRace: replicas of gpuproxy on one database create
// services of one account at once with the same name (then the same
// model): exactly one wins each round, and every other gets a conflict
// naming the field.
func TestServiceCreateRace(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a := mustAccount(t, stores[0], "race")
			for round := range 5 {
				for _, field := range []string{"name", "model"} {
					var wg sync.WaitGroup
					errs := make([]error, 8)
					start := make(chan struct{})
					for i := range errs {
						wg.Go(func() {
							id := fmt.Sprintf("svc_%d_%s_%d", round, field, i)
							name, model := fmt.Sprintf("n%d", round), id // same name
							if field == "model" {
								name, model = id, fmt.Sprintf("m%d", round) // same model
							}
							<-start
							_, errs[i] = stores[i%len(stores)].CreateService(ctx, fullService(a.ID, id, name, model))
						})
					}
					close(start)
					wg.Wait()
					won := 0
					for _, err := range errs {
						if err == nil {
							won++
							continue
						}
						wantConflictOn(t, err, field)
					}
					if won != 1 {
						t.Fatalf("round %d, same %s: %d creates won, want 1 (%v)", round, field, won, errs)
					}
				}
			}
			list, err := stores[1].Services(ctx, a.ID)
			if err != nil || len(list) != 10 {
				t.Fatalf("services after the race = %d, %v", len(list), err)
			}
		})
	}
}

// TestUsageServiceFields: usage records carry the service, the model and
// the token counts through the batch insert (with and without a batch id)
// and back; the instance proxy's records read empty and 0; negative counts
// are clamped.
func TestUsageServiceFields(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "tokens")
		var recs []gpuproxy.Usage
		for i := range 70 { // more than one SQLite INSERT
			u := usageRec(a.ID, "gpi_a", 200, t0.Add(time.Duration(i)*time.Second), i)
			if i%2 == 0 {
				u.ServiceID, u.Model = "svc_1", fmt.Sprintf("llama-%d", i)
				u.PromptTokens, u.CompletionTokens = int64(1000+i), int64(1<<40+i)
			}
			recs = append(recs, u)
		}
		if err := s.InsertUsage(ctx, "", recs[:35]); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertUsage(ctx, "batch-1", recs[35:]); err != nil {
			t.Fatal(err)
		}
		neg := usageRec(a.ID, "gpi_a", 200, t0.Add(time.Hour), 999)
		neg.ServiceID, neg.Model, neg.PromptTokens, neg.CompletionTokens = "svc_2", "m", -1, -2
		if err := s.InsertUsage(ctx, "", []gpuproxy.Usage{neg}); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListUsage(ctx, gpuproxy.UsageFilter{AccountID: a.ID, Limit: 1000})
		if err != nil || len(got) != 71 {
			t.Fatalf("listed %d records, %v", len(got), err)
		}
		if u := got[0]; u.RequestID != "req-999" || u.ServiceID != "svc_2" || u.Model != "m" || u.PromptTokens != 0 || u.CompletionTokens != 0 {
			t.Fatalf("clamped record = %+v", u)
		}
		byReq := map[string]gpuproxy.Usage{}
		for _, u := range got[1:] {
			byReq[u.RequestID] = u
		}
		for i, w := range recs {
			u := byReq[w.RequestID]
			if u.ServiceID != w.ServiceID || u.Model != w.Model || u.PromptTokens != w.PromptTokens ||
				u.CompletionTokens != w.CompletionTokens || u.InstanceID != "gpi_a" || !u.At.Equal(w.At) {
				t.Fatalf("record %d = %+v, want %+v", i, u, w)
			}
		}
	})
}
