package main

import (
	"encoding/json"
	"testing"
	"time"
)

// TestBreakdownFromTheServiceView: the breakdown reads the replicas as
// GET /api/v1/services/NAME shows them (prices as decimal dollars) and
// puts each second where it belongs, loading not charged, as the ledger
// charges it.
func TestBreakdownFromTheServiceView(t *testing.T) {
	t.Parallel()
	const view = `{"instances":[
		{"state":"ready","instance_status":"running","market":"interruptible","price_per_hour":0.2},
		{"state":"ready","instance_status":"running","market":"interruptible","price_per_hour":0.2},
		{"state":"starting","instance_status":"running","market":"interruptible","price_per_hour":0.25},
		{"state":"unready","instance_status":"preempted","market":"interruptible","price_per_hour":0.2},
		{"state":"draining","instance_status":"running","market":"on-demand","price_per_hour":0.4},
		{"state":"starting","instance_status":"starting","market":"on-demand","price_per_hour":0.4}]}`
	var v struct {
		Instances []replicaSample `json:"instances"`
	}
	if err := json.Unmarshal([]byte(view), &v); err != nil {
		t.Fatal(err)
	}
	var b Breakdown
	b.add(v.Instances, 2, time.Hour)
	want := Breakdown{SpotSeconds: 3 * 3600, SpotMicros: 650_000, OnDemSeconds: 3600, OnDemMicros: 400_000,
		StartupSeconds: 3600, StartupMicros: 250_000, DrainSeconds: 3600, DrainMicros: 400_000,
		LoadingSeconds: 3600, PausedSeconds: 3600, OverSeconds: 3600, OverMicros: 200_000,
		OverlapSeconds: 3600, OverlapMicros: 400_000, Samples: 1}
	if b != want {
		t.Errorf("breakdown\n got %+v\nwant %+v", b, want)
	}
	if got, err := micros("0.123456"); got != 123_456 || err != nil {
		t.Errorf("micros(0.123456) = %d, %v", got, err)
	}
}
