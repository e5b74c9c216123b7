package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
)

// TestReplicaInstances: one query returns the instances of a service's
// replicas that are not gone, by id — not a gone replica's, not another
// service's, never another account's (even a replica row naming it); a
// replica whose instance does not exist has none.
func TestReplicaInstances(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		b := mustAccount(t, s, "b")
		mustService(t, s, fullService(a.ID, "svc_1", "chat", "llama"))
		mustService(t, s, fullService(a.ID, "svc_2", "embed", "bge"))
		for _, in := range []struct {
			acct int64
			id   string
		}{{a.ID, "gpi_1"}, {a.ID, "gpi_2"}, {a.ID, "gpi_3"}, {a.ID, "gpi_4"}, {b.ID, "gpi_b"}} {
			mustAdmitInstance(t, s, in.acct, usd, newInstance(in.id, "k-"+in.id, "time", usd), t0)
		}
		for i, r := range []struct{ svc, id string }{
			{"svc_1", "gpi_1"}, {"svc_1", "gpi_2"}, {"svc_1", "gpi_3"}, {"svc_2", "gpi_4"},
			{"svc_1", "gpi_b"},       // another account's instance: never returned
			{"svc_1", "gpi_missing"}, // no such instance
		} {
			if err := s.AddReplica(ctx, gpuproxy.Replica{ServiceID: r.svc, InstanceID: r.id, AccountID: a.ID,
				CreatedAt: t0.Add(time.Duration(i) * time.Second)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetReplicaState(ctx, "svc_1", "gpi_3", gpuproxy.ReplicaGone, "scale_down", t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReplicaInstances(ctx, "svc_1")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got["gpi_1"].ID != "gpi_1" || got["gpi_2"].ID != "gpi_2" || got["gpi_1"].AccountID != a.ID ||
			got["gpi_2"].GPUName != "RTX 4090" {
			t.Fatalf("svc_1's replica instances = %+v", got)
		}
		if got, err := s.ReplicaInstances(ctx, "svc_2"); err != nil || len(got) != 1 || got["gpi_4"].ID != "gpi_4" {
			t.Fatalf("svc_2's replica instances = %+v, %v", got, err)
		}
		if got, err := s.ReplicaInstances(ctx, "svc_nope"); err != nil || len(got) != 0 {
			t.Fatalf("a missing service's replica instances = %+v, %v", got, err)
		}
	})
}

// TestServiceBlock: a service's refused-rent record reads as zero until
// one is set, is replaced whole by each set that names the counts stored
// (a set from a stale read is a conflict and changes nothing), and is per
// service; a missing service cannot have one.
func TestServiceBlock(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		mustService(t, s, fullService(a.ID, "svc_1", "chat", "llama"))
		mustService(t, s, fullService(a.ID, "svc_2", "embed", "bge"))
		if b, err := s.ServiceBlock(ctx, "svc_1"); err != nil || b != (gpuproxy.ServiceBlock{}) {
			t.Fatalf("no refusal yet: %+v, %v", b, err)
		}
		want := gpuproxy.ServiceBlock{Refused: 3, Streak: 2, Until: t0.Add(40 * time.Second)}
		if err := s.SetServiceBlock(ctx, "svc_1", gpuproxy.ServiceBlock{}, want); err != nil {
			t.Fatal(err)
		}
		b, err := s.ServiceBlock(ctx, "svc_1")
		if err != nil || b.Refused != 3 || b.Streak != 2 || !b.Until.Equal(want.Until) {
			t.Fatalf("after a set: %+v, %v", b, err)
		}
		if b, err := s.ServiceBlock(ctx, "svc_2"); err != nil || b != (gpuproxy.ServiceBlock{}) {
			t.Fatalf("another service's record: %+v, %v", b, err)
		}
		// A set from a stale read (a refusal read before a reset) is refused.
		if err := s.SetServiceBlock(ctx, "svc_1", gpuproxy.ServiceBlock{Refused: 2, Streak: 1},
			gpuproxy.ServiceBlock{Refused: 3, Streak: 2}); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("a set from a stale read: %v", err)
		}
		if err := s.SetServiceBlock(ctx, "svc_1", gpuproxy.ServiceBlock{}, gpuproxy.ServiceBlock{Refused: 9}); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("a set as if none were stored: %v", err)
		}
		if b, err := s.ServiceBlock(ctx, "svc_1"); err != nil || b.Refused != 3 || b.Streak != 2 || !b.Until.Equal(want.Until) {
			t.Fatalf("a refused set changed the record: %+v, %v", b, err)
		}
		if err := s.SetServiceBlock(ctx, "svc_1", want, gpuproxy.ServiceBlock{Refused: 3}); err != nil {
			t.Fatal(err)
		}
		if b, err := s.ServiceBlock(ctx, "svc_1"); err != nil || b.Refused != 3 || b.Streak != 0 || !b.Until.IsZero() {
			t.Fatalf("after clearing the streak: %+v, %v", b, err)
		}
		if err := s.SetServiceBlock(ctx, "svc_nope", gpuproxy.ServiceBlock{}, want); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("a missing service's record: %v", err)
		}
		if err := s.SetServiceBlock(ctx, "svc_1", gpuproxy.ServiceBlock{}, gpuproxy.ServiceBlock{Refused: -1}); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("a negative count: %v", err)
		}
	})
}
