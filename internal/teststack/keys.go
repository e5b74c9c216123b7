package teststack

import (
	"context"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
)

// NewKey creates account on a if it does not exist yet, then a key named
// "test" with the scopes of the named preset (gpuproxy.Presets), and
// returns the key and the account.
func NewKey(t testing.TB, a *auth.Service, account, preset string) (string, gpuproxy.Account) {
	t.Helper()
	ctx := context.Background()
	acct, err := a.Account(ctx, account)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		acct, err = a.CreateAccount(ctx, account)
	}
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := a.CreateKey(ctx, account, "test", gpuproxy.Presets[preset])
	if err != nil {
		t.Fatal(err)
	}
	return k, acct
}
