package attack

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// prepareProxyInstance creates the proxy account's instance and waits for
// it to run.
func prepareProxyInstance(ctx context.Context, t *testing.T, a *api, key string, o offer) instance {
	t.Helper()
	res := a.create(ctx, 0, key, o, 1, "atk-proxy-instance")
	if res.inst.ID == "" {
		t.Fatalf("creating the proxy account's instance on %s %s: %s", o.Provider, o.OfferID, res.final)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		inst, r := a.get(ctx, 0, key, res.inst.ID)
		if r.status == http.StatusOK && inst.Status == "running" {
			return inst
		}
		if inst.Status == "failed" || inst.Status == "terminated" {
			t.Fatalf("proxy instance %s is %s: %s", inst.ID, inst.Status, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("proxy instance %s not running within 30s", res.inst.ID)
	return instance{}
}

// rentRunning rents the first of offers (at most tries of them) that is
// still there, for one hour, and waits until it runs.
func rentRunning(ctx context.Context, a *api, key string, offers []offer, tries int) (instance, error) {
	var last string
	for i, o := range offers {
		if i == tries {
			break
		}
		res := a.create(ctx, i, key, o, 1, fmt.Sprintf("atk-rent-%s-%d", o.OfferID, i))
		if res.inst.ID == "" {
			last = fmt.Sprintf("%s %s: %s", o.Provider, o.OfferID, res.final)
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			inst, r := a.get(ctx, 0, key, res.inst.ID)
			if r.status == http.StatusOK && inst.Status == "running" {
				return inst, nil
			}
			if inst.Status == "failed" || inst.Status == "terminated" {
				return instance{}, fmt.Errorf("instance %s is %s: %s", inst.ID, inst.Status, r)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return instance{}, fmt.Errorf("instance %s not running within 30s", res.inst.ID)
	}
	return instance{}, fmt.Errorf("no offer rented (last: %s)", last)
}

// waitSettled polls until no instance is in flight, every stopped meter is
// charged to its stop, no lease older than maxLeaseAge is open, and
// notBefore has passed.
func waitSettled(ctx context.Context, url string, limit, maxLeaseAge time.Duration, notBefore time.Time) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st, err := readState(ctx, url)
		if err == nil && st.settled(maxLeaseAge) && time.Now().After(notBefore) {
			// Once more after a metering round, so a last charge or a lease
			// settlement in progress lands before the checks.
			time.Sleep(meteringInt + 200*time.Millisecond)
			return true
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false
}

func (s *dbState) settled(maxLeaseAge time.Duration) bool {
	for _, in := range s.instances {
		if in.status == "pending" || in.status == "starting" || in.status == "terminating" {
			return false
		}
	}
	for _, m := range s.meters {
		if m.stopped && m.chargedUntilUS < m.stopUS {
			return false
		}
	}
	for _, h := range s.holds {
		if maxLeaseAge >= 0 && h.status == "open" && strings.HasPrefix(h.ref, "lease:") &&
			time.Duration(s.nowUS-h.createdUS)*time.Microsecond > maxLeaseAge {
			return false
		}
	}
	return true
}

// accountSpend is the account's total spend over the whole run.
func (s *dbState) accountSpend(name string) int64 {
	a := s.byName[name]
	if a == nil {
		return 0
	}
	var sum int64
	for _, e := range s.ledger {
		if e.account == a.id {
			sum += e.spend
		}
	}
	return sum
}

// replicaDBURL is the database URL the replicas get: with
// GPUPROXY_ATTACK_PG_POOL set, its pool_max_conns (the driver's default
// is the greater of 4 and the CPU count).
func replicaDBURL(url string) string {
	if n := os.Getenv("GPUPROXY_ATTACK_PG_POOL"); n != "" {
		return url + "&pool_max_conns=" + n
	}
	return url
}
