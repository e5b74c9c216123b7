package apptest_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/app/apptest"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

// TestStackServesEveryReplicaOverOneDatabase: on both stores, two
// replicas served through app.Serve share the database (a key made on
// the first works on the second), both simulators answer the adapters,
// and each replica's background work runs until the test ends.
func TestStackServesEveryReplicaOverOneDatabase(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			var ran [2]chan struct{}
			for i := range ran {
				ran[i] = make(chan struct{})
			}
			var n atomic.Int64
			s := apptest.New(t, apptest.Options{Kind: k, Replicas: 2, Serve: apptest.Listener, IONet: &ionetsim.Options{},
				Config: app.Config{NoOAuth: true},
				Run: func(ctx context.Context, a *app.App) {
					close(ran[n.Add(1)-1])
					a.Run(ctx)
				}})
			if len(s.Apps) != 2 || len(s.URLs) != 2 || s.Vast == nil || s.IONet == nil {
				t.Fatalf("stack: %d apps, %d URLs, vast %v, io.net %v", len(s.Apps), len(s.URLs), s.Vast, s.IONet)
			}
			for _, c := range ran {
				<-c
			}
			key, _ := s.Key("acme", "engineer")
			for i, u := range s.URLs {
				if r := teststack.Send(t, http.MethodGet, u+"/api/v1/spending", nil, "X-API-Key", key); r.Status != 200 {
					t.Fatalf("replica %d: %d %s", i, r.Status, r.Body)
				}
			}
			res, err := s.App().Fleet.Offers(context.Background(), fleet.OfferQuery{})
			if err != nil || len(res.Errors) > 0 || len(res.Offers) == 0 {
				t.Fatalf("offers through both simulators: %v %+v", err, res.Errors)
			}
		})
	}
}

// TestStackServesTLS: Client trusts the stack's certificate.
func TestStackServesTLS(t *testing.T) {
	s := apptest.New(t, apptest.Options{Serve: apptest.TLS, NoVast: true})
	res, err := s.Client().Get(s.URL() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || s.Vast != nil {
		t.Fatalf("/health over TLS: %d (vast %v)", res.StatusCode, s.Vast)
	}
}
