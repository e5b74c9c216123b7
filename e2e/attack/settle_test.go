package attack

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// prepareProxyInstance creates the proxy account's instance and waits for
// it to run.
func prepareProxyInstance(ctx context.Context, t *testing.T, a *api, key string, o offer) instance {
	t.Helper()
	res := a.create(ctx, 0, key, o, 1, "atk-proxy-instance")
	if res.inst.ID == "" {
		t.Fatalf("creating the proxy account's instance on %s %s: %s", o.Provider, o.OfferID, res.final)
	}
	var inst instance
	var running bool
	testpoll.WaitEvery(30*time.Second, 100*time.Millisecond, func() bool {
		var r reply
		inst, r = a.get(ctx, 0, key, res.inst.ID)
		if inst.Status == "failed" || inst.Status == "terminated" {
			t.Fatalf("proxy instance %s is %s: %s", inst.ID, inst.Status, r)
		}
		running = r.status == http.StatusOK && inst.Status == "running"
		return running
	})
	if !running {
		t.Fatalf("proxy instance %s not running within 30s", res.inst.ID)
	}
	return inst
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
		var (
			inst instance
			r    reply
		)
		testpoll.WaitEvery(30*time.Second, 100*time.Millisecond, func() bool {
			inst, r = a.get(ctx, 0, key, res.inst.ID)
			return r.status == http.StatusOK && inst.Status == "running" || inst.Status == "failed" || inst.Status == "terminated"
		})
		switch {
		case r.status == http.StatusOK && inst.Status == "running":
			return inst, nil
		case inst.Status == "failed" || inst.Status == "terminated":
			return instance{}, fmt.Errorf("instance %s is %s: %s", inst.ID, inst.Status, r)
		}
		return instance{}, fmt.Errorf("instance %s not running within 30s", res.inst.ID)
	}
	return instance{}, fmt.Errorf("no offer rented (last: %s)", last)
}

// waitSettled polls until no instance is in flight, every stopped meter is
// charged to its stop, no lease older than maxLeaseAge is open, and
// notBefore has passed.
func waitSettled(ctx context.Context, url string, limit, maxLeaseAge time.Duration, notBefore time.Time) bool {
	settled := testpoll.WaitEvery(limit, 250*time.Millisecond, func() bool {
		if ctx.Err() != nil {
			return true
		}
		st, err := readState(ctx, url)
		return err == nil && st.settled(maxLeaseAge) && time.Now().After(notBefore)
	}) && ctx.Err() == nil
	if settled {
		// Once more after a metering round, so a last charge or a lease
		// settlement in progress lands before the checks.
		// pace: a metering round must really pass; the state marks none.
		time.Sleep(meteringInt + 200*time.Millisecond)
	}
	return settled
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
