package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// TestMeterStartsWhenTheInstanceRuns: vast.ai bills a loading instance's
// disk only, and GPU time from when it runs, while its start_date is when
// the rental began. The meter, and the instance's started_at, begin no
// sooner than the simulator reached running (within one poll after it), so
// an image pull of 1.2 s is not charged at the GPU's price. (Before, the
// meter started at start_date: the whole loading time was charged.)
func TestMeterStartsWhenTheInstanceRuns(t *testing.T) {
	const load = 1200 * time.Millisecond
	w := newWorld(t, dbtest.SQLite, worldOpts{vastOpts: func(o *vastaisim.Options) { o.StartDelay = load }})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.VastAI, 2)
	rented := time.Now()
	inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID,
		Image: "vllm/vllm-openai:latest", IdempotencyKey: "meter-start"})
	if err != nil {
		t.Fatal(err)
	}
	inst = w.waitRunning(f, inst.ID)
	ran := rented.Add(load)
	if inst.StartedAt.Before(ran) {
		t.Fatalf("started_at %v is %v after the rent: before the simulator ran it (%v of loading billed at the GPU's price)",
			inst.StartedAt, inst.StartedAt.Sub(rented), ran.Sub(inst.StartedAt))
	}
	// Seen within a poll (40 ms here), allowing for a loaded machine.
	if late := inst.StartedAt.Sub(ran); late > time.Second {
		t.Fatalf("started_at %v after the instance ran", late)
	}
}
