package economics_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
)

// TestServiceToDate: a service's figures to date are its row of the
// summary by service over [created, now), to the micro-dollar, on both
// stores; an older service counts its last MaxPeriod, a new one nothing.
func TestServiceToDate(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		s, a, _ := seeded(t, k)
		svc := economics.New(s, fixedNow)
		ctx := context.Background()
		for _, created := range []time.Time{economicstest.From, economicstest.From.Add(6 * time.Hour)} {
			got, err := svc.ServiceToDate(ctx, a.ID, economicstest.ServiceName, created)
			if err != nil {
				t.Fatal(err)
			}
			if !got.From.Equal(created) || !got.To.Equal(economicstest.Now) {
				t.Errorf("period [%s, %s), want [%s, %s)", got.From, got.To, created, economicstest.Now)
			}
			sum, err := svc.Summary(ctx, economics.Query{AccountID: a.ID, From: got.From, To: got.To, GroupBy: economics.ByService})
			if err != nil {
				t.Fatal(err)
			}
			var want economics.ToDate
			for _, r := range sum.Rows {
				if r.Group == economicstest.ServiceName {
					want = economics.ToDate{From: got.From, To: got.To, Requests: r.Requests, PromptTokens: r.PromptTokens,
						CompletionTokens: r.CompletionTokens, GPUCost: r.GPUCost, ProxyCharges: r.ProxyCharges}
				}
			}
			if got != want || want.GPUCost == 0 || want.CompletionTokens == 0 {
				t.Errorf("created %s: to date %+v, the summary by service %+v", created, got, want)
			}
		}
		// From its start the service has more than from T0+6h: a period
		// that cuts its history is not the whole of it.
		all, _ := svc.ServiceToDate(ctx, a.ID, economicstest.ServiceName, economicstest.From)
		late, _ := svc.ServiceToDate(ctx, a.ID, economicstest.ServiceName, economicstest.From.Add(7*time.Hour))
		if late.Requests >= all.Requests {
			t.Errorf("from T0+6h %d requests, from T0 %d", late.Requests, all.Requests)
		}
		old, err := svc.ServiceToDate(ctx, a.ID, economicstest.ServiceName, economicstest.Now.Add(-2*economics.MaxPeriod))
		if err != nil || !old.From.Equal(economicstest.Now.Add(-economics.MaxPeriod)) || old.GPUCost != all.GPUCost {
			t.Errorf("a service older than MaxPeriod: %+v, %v", old, err)
		}
		fresh, err := svc.ServiceToDate(ctx, a.ID, economicstest.ServiceName, economicstest.Now)
		if err != nil || fresh.Requests != 0 || fresh.GPUCost != 0 {
			t.Errorf("a service created now: %+v, %v", fresh, err)
		}
		none, err := svc.ServiceToDate(ctx, a.ID, "no-such-service", economicstest.From)
		if err != nil || none.Requests != 0 || none.GPUCost != 0 {
			t.Errorf("a name with no service: %+v, %v", none, err)
		}
	})
}
