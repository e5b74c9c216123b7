package db_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestLifetimePolicyUpdatesKeepEachOther: admins on four replicas change
// different fields of one account's policy at once; every change is kept
// (read and written under the account's lock), and a change that refuses
// writes nothing.
func TestLifetimePolicyUpdatesKeepEachOther(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			stores := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a, err := stores[0].CreateAccount(ctx, "policy", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			set := []func(p *gpuproxy.LifetimePolicy, d *time.Duration){
				func(p *gpuproxy.LifetimePolicy, d *time.Duration) { p.DefaultIdleTimeout = d },
				func(p *gpuproxy.LifetimePolicy, d *time.Duration) { p.DefaultMaxDuration = d },
				func(p *gpuproxy.LifetimePolicy, d *time.Duration) { p.MaxIdleTimeout = d },
				func(p *gpuproxy.LifetimePolicy, d *time.Duration) { p.MaxMaxDuration = d },
			}
			var wg sync.WaitGroup
			for i, f := range set {
				wg.Go(func() {
					d := time.Duration(i+1) * time.Hour
					_, err := stores[i].UpdateLifetimePolicy(ctx, a.ID, func(p gpuproxy.LifetimePolicy) (gpuproxy.LifetimePolicy, error) {
						// pace: holds the read-to-write window open for the others.
						time.Sleep(5 * time.Millisecond)
						f(&p, &d)
						return p, nil
					})
					if err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			p, err := stores[0].LifetimePolicy(ctx, a.ID)
			if err != nil || p.DefaultIdleTimeout == nil || p.DefaultMaxDuration == nil || p.MaxIdleTimeout == nil ||
				p.MaxMaxDuration == nil || *p.MaxMaxDuration != 4*time.Hour {
				t.Fatalf("a change was lost: %+v %v", p, err)
			}
			if _, err := stores[1].UpdateLifetimePolicy(ctx, a.ID, func(p gpuproxy.LifetimePolicy) (gpuproxy.LifetimePolicy, error) {
				p.DefaultIdleTimeout = nil
				return p, gpuproxy.Invalid("default_idle_timeout", "refused")
			}); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("refusal: %v", err)
			}
			if p, _ := stores[0].LifetimePolicy(ctx, a.ID); p.DefaultIdleTimeout == nil {
				t.Fatal("a refused change was written")
			}
		})
	}
}
