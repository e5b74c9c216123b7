package ionet

import (
	"slices"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

// TestCreatePassThrough: a create's args reach io.net as
// container_config.args and its image_login as registry_username and
// registry_secret; an onstart, which io.net cannot run, and a login not
// in "-u USER -p TOKEN" form are refused naming the field, before any
// call and without quoting the login.
func TestCreatePassThrough(t *testing.T) {
	sim, a := setup(t, ionetsim.Options{}, Options{})
	const secret = "ghp_io_secret_0123456789"
	args := []string{"--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"}
	if _, err := a.Create(ctx, providers.CreateRequest{OfferID: "203:1:2", Tag: "gp-pass-1", Image: "ghcr.io/acme/llm:1",
		Hours: 1, Args: args, ImageLogin: "-u robot -p " + secret + " ghcr.io"}); err != nil {
		t.Fatal(err)
	}
	ds := sim.Deployments()
	if len(ds) != 1 || !slices.Equal(ds[0].Args, args) || ds[0].RegistryUser != "robot" || !ds[0].RegistrySecret {
		t.Fatalf("deployments %+v", ds)
	}
	for _, c := range []struct {
		req   providers.CreateRequest
		field string
	}{
		{providers.CreateRequest{Onstart: "echo hi"}, "onstart"},
		{providers.CreateRequest{ImageLogin: secret}, "image_login"},
		{providers.CreateRequest{ImageLogin: "-u robot " + secret}, "image_login"},
	} {
		c.req.OfferID, c.req.Tag, c.req.Image, c.req.Hours = "203:1:2", "gp-pass-2", "img", 1
		_, err := a.Create(ctx, c.req)
		pe := wantKind(t, err, providers.KindInvalid)
		if pe.Field != c.field || strings.Contains(pe.Error(), secret) {
			t.Errorf("%+v: %v (field %q), want a refusal naming %s without the secret", c.req, err, pe.Field, c.field)
		}
		if err := a.CheckCreate(c.req); providers.KindOf(err) != providers.KindInvalid {
			t.Errorf("CheckCreate(%+v) = %v", c.req, err)
		}
	}
	if n := len(sim.Deployments()); n != 1 {
		t.Fatalf("%d deployments after the refusals, want 1", n)
	}
}
