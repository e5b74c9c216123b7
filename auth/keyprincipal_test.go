package auth_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// KeyPrincipal re-validates a key by id (for console sessions) and shares
// Authenticate's cache: an entry it loads must still verify the key itself.
func TestKeyPrincipal(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	ctx := context.Background()
	svc := auth.New(st, auth.Options{CacheTTL: time.Minute})
	if _, err := svc.CreateAccount(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	key, rec, err := svc.CreateKey(ctx, "acme", "books", gpuproxy.Presets["finance"])
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.KeyPrincipal(ctx, rec.ID)
	if err != nil || p.AccountName != "acme" || p.KeyID != rec.ID || !slices.Equal(p.Scopes, gpuproxy.Presets["finance"]) {
		t.Fatalf("principal %+v %v", p, err)
	}
	if q, err := svc.Authenticate(ctx, key); err != nil || q.KeyID != rec.ID {
		t.Fatalf("the key after KeyPrincipal cached its record: %+v %v", q, err)
	}
	for _, id := range []string{"", "0123456789abcdef", "jwt:acme:x", rec.ID + "0", "jwt:acme"} {
		if _, err := svc.KeyPrincipal(ctx, id); gpuproxy.ErrorCode(err) != gpuproxy.EUNAUTHORIZED {
			t.Errorf("id %q: %v", id, err)
		}
	}
	if err := svc.RevokeKey(ctx, "acme", rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.KeyPrincipal(ctx, rec.ID); gpuproxy.ErrorCode(err) != gpuproxy.EUNAUTHORIZED {
		t.Fatalf("revoked key: %v", err)
	}
}
