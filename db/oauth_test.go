package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
)

// TestOAuthClientsThatNeverConnectGo: registration is open, so a client
// registered over 30 days ago with no token and no request in flight is
// deleted when another registers; one that connected stays.
func TestOAuthClientsThatNeverConnectGo(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		reg := func(id string, at time.Time) {
			t.Helper()
			if err := s.CreateOAuthClient(ctx, gpuproxy.OAuthClient{ID: id, Name: id, RedirectURIs: []string{"https://a.example/cb"},
				AuthMethod: "none", CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
		}
		reg("idle", t0)
		reg("used", t0)
		if err := s.CreateOAuthTokens(ctx, t0, gpuproxy.OAuthToken{Hash: "h1", Kind: gpuproxy.OAuthRefresh, GrantID: "g1",
			ClientID: "used", KeyID: "k", CreatedAt: t0, ExpiresAt: t0.Add(90 * 24 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		reg("fresh", t0.Add(29*24*time.Hour))
		for _, id := range []string{"idle", "used", "fresh"} {
			if _, err := s.OAuthClient(ctx, id); err != nil {
				t.Fatalf("%s after 29 days: %v", id, err)
			}
		}
		reg("later", t0.Add(31*24*time.Hour))
		if _, err := s.OAuthClient(ctx, "idle"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Errorf("a client that never connected, 31 days on: %v, want not found", err)
		}
		for _, id := range []string{"used", "fresh", "later"} {
			if _, err := s.OAuthClient(ctx, id); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		}
	})
}
