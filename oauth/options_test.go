package oauth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/oauth"
)

// TestOptionsValidate: each unusable field is refused by name, with its
// configured value; zero fields are valid (they take the defaults), and so
// is a negative TokenCacheTTL (no cache).
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []oauth.Options{{}, {TokenCacheTTL: -1}, {Issuer: "https://gpuproxy.example.com/"}} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
	}
	for want, o := range map[string]oauth.Options{
		"oauth.Options.AccessTokenTTL: must not be negative, got -10m0s":           {AccessTokenTTL: -10 * time.Minute},
		"oauth.Options.RefreshTokenTTL: must not be negative, got -1h0m0s":         {RefreshTokenTTL: -time.Hour},
		"oauth.Options.RegistrationsPerMinute: must not be negative, got -3":       {RegistrationsPerMinute: -3},
		`oauth.Options.ConsentPath: must be a path starting with /, got "consent"`: {ConsentPath: "consent"},
		`oauth.issuer: want the server's base URL, like https://gpuproxy.example.com; got "https://x.example/mcp"`: {
			Issuer: "https://x.example/mcp"},
	} {
		if err := o.Validate(); err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}
