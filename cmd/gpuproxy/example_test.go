package main

import (
	"testing"
)

// TestExampleConfigLoads keeps gpuproxy.example.yaml valid.
func TestExampleConfigLoads(t *testing.T) {
	c, err := loadConfig("../../gpuproxy.example.yaml", envFunc(nil))
	if err != nil {
		t.Fatal(err)
	}
	if ws, err := c.windows(); err != nil || len(ws) != 2 || ws[1].Minutes != 1440 {
		t.Fatalf("windows %v %v", ws, err)
	}
	if c.Fleet.OrphanPolicy != "destroy" || c.Providers.VastAI.BreakerFailures != 5 {
		t.Fatalf("config = %+v", c)
	}
}
