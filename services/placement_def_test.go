package services_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/services"
)

// TestPlacementDefinition: placement, overprovision and preempted_grace
// take their defaults, round-trip through the view, and a bad value is a
// 400 naming its field, as REST, MCP and the CLI all decode a definition.
func TestPlacementDefinition(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{})
	const base = `"model":"m%s","spec":{"max_price_per_hour":1},"image":"img","port":8000`
	def := func(name, extra string) string {
		b := strings.Replace(base, "%s", name, 1)
		return `{"name":"` + name + `",` + b + extra + `}`
	}
	create := func(d string) (services.View, error) {
		dd, err := services.DecodeDefinition([]byte(d), nil)
		if err != nil {
			return services.View{}, err
		}
		return s.apps[0].Services.Create(context.Background(), s.principal(), dd)
	}
	v, err := create(def("od", ""))
	if err != nil || v.Placement != string(gpuproxy.PlacementOnDemand) || v.Overprovision == nil || *v.Overprovision != 0 ||
		v.PreemptedGrace != "10m" || v.Replicas.Max != 1 {
		t.Fatalf("default placement: %v %s", err, mustJSON(v))
	}
	v, err = create(def("spot", `,"placement":"interruptible-with-fallback","spec":{"max_price_per_hour":1,"bid_margin":0.5},`+
		`"preempted_grace":"2m"`))
	if err != nil || v.Placement != string(gpuproxy.PlacementFallback) || *v.Overprovision != services.DefaultOverprovision ||
		v.Replicas.Max != 2 || v.PreemptedGrace != "2m" || v.Spec.BidMargin == nil || *v.Spec.BidMargin != 0.5 {
		t.Fatalf("interruptible-with-fallback: %v %s", err, mustJSON(v))
	}
	for _, tc := range []struct{ extra, field, want string }{
		{`,"placement":"spot"`, "placement", `must be "on-demand", "interruptible" or "interruptible-with-fallback"`},
		{`,"placement":7`, "placement", "must be a string"},
		{`,"overprovision":2`, "overprovision", "applies to interruptible placements"},
		{`,"placement":"interruptible","overprovision":-1`, "overprovision", "from 0"},
		{`,"placement":"interruptible","overprovision":1.5`, "overprovision", ""},
		{`,"placement":"interruptible","overprovision":2,"replicas":{"min":1,"max":2}`, "overprovision",
			"replicas.min (1) + overprovision (2) must be at most replicas.max (2)"},
		{`,"placement":"interruptible","overprovision":1,"replicas":{"min":64}`, "overprovision", "at most the most replicas"},
		{`,"preempted_grace":"forever"`, "preempted_grace", ""},
		{`,"preempted_grace":"48h"`, "preempted_grace", "24h"},
		{`,"spec":{"max_price_per_hour":1,"market":"interruptible"}`, "spec.market", "set by the service's placement"},
		{`,"spec":{"max_price_per_hour":1,"bid_margin":0.5}`, "spec.bid_margin", "applies to interruptible replicas"},
		{`,"placement":"interruptible","spec":{"max_price_per_hour":1,"bid_margin":99}`, "spec.bid_margin", ""},
	} {
		_, err := create(def("bad", tc.extra))
		var e *gpuproxy.Error
		if !errors.As(err, &e) || e.Code != gpuproxy.EINVALID || e.Details["field"] != tc.field ||
			!strings.Contains(e.Message, tc.want) {
			t.Errorf("%s: %v, want invalid naming %s: …%s", tc.extra, err, tc.field, tc.want)
		}
	}
	// An update to on-demand drops the placement's default
	// overprovision; an interruptible one takes it.
	pr := s.principal()
	up := func(name, patch string) (services.View, error) {
		return s.apps[0].Services.Update(context.Background(), pr, name, []byte(patch))
	}
	if v, err := up("spot", `{"placement":"on-demand","spec":{"bid_margin":null}}`); err != nil ||
		*v.Overprovision != 0 || v.Placement != "on-demand" {
		t.Fatalf("update to on-demand: %v %s", err, mustJSON(v))
	}
	if v, err := up("od", `{"placement":"interruptible","replicas":{"max":3}}`); err != nil ||
		*v.Overprovision != 1 || v.Replicas.Max != 3 {
		t.Fatalf("update to interruptible: %v %s", err, mustJSON(v))
	}
}
