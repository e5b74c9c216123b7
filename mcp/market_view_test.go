package mcp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// marketOut is the market part of an instance in a tool's result.
type marketOut struct {
	instanceOut
	Market     string  `json:"market"`
	BidPerHour float64 `json:"bid_per_hour"`
	StatusMsg  string  `json:"status_msg"`
}

// TestInstanceToolsShowMarket: create_gpu_instance answers an
// interruptible rent's market and bid, in its structured result and its
// text; once the poller records a preemption, list_my_instances (status
// preempted) shows it with vast.ai's status_msg, in both.
func TestInstanceToolsShowMarket(t *testing.T) {
	s := newStack(t, stackOpts{quiet: true, market: &vastaisim.Market{Tick: 20 * time.Millisecond}})
	key, p := s.key("acme", "assistant")
	cs := s.connect(viaStreamable, key, nil)
	res := callTool(t, cs, "create_gpu_instance", map[string]any{"image": "vllm/vllm-openai:latest",
		"spec": map[string]any{"max_price_per_hour": 1, "providers": "vast.ai", "market": "interruptible"}})
	inst := structured[marketOut](t, res)
	if inst.Market != "interruptible" || inst.BidPerHour <= 0 || inst.BidPerHour >= inst.PricePerHour ||
		!strings.Contains(text(res), "interruptible, bid $") {
		t.Fatalf("created: %+v\n%s", inst, text(res))
	}
	ctx := context.Background()
	status := func(want gpuproxy.InstanceStatus) func() bool {
		return func() bool {
			if err := s.fleet.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			in, err := s.store.Instance(ctx, p.AccountID, inst.ID)
			return err == nil && in.Status == want
		}
	}
	testpoll.Until(t, 20*time.Second, inst.ID+" running", status(gpuproxy.Running))
	var pid int64
	for _, si := range s.vast.Instances() {
		if si.Label == inst.ID {
			pid = si.ID
		}
	}
	if err := s.vast.Preempt(pid, time.Hour); err != nil {
		t.Fatal(err)
	}
	testpoll.Until(t, 20*time.Second, inst.ID+" preempted", status(gpuproxy.Preempted))
	res = callTool(t, cs, "list_my_instances", map[string]any{"status": "preempted"})
	list := structured[struct {
		Instances []marketOut `json:"instances"`
	}](t, res)
	if len(list.Instances) != 1 || list.Instances[0].Status != "preempted" || list.Instances[0].Market != "interruptible" ||
		list.Instances[0].BidPerHour != inst.BidPerHour || !strings.HasPrefix(list.Instances[0].StatusMsg, "paused") {
		t.Fatalf("listed: %+v\n%s", list, text(res))
	}
	if want := inst.ID + " is preempted; vast.ai says: paused"; !strings.Contains(text(res), want) {
		t.Fatalf("the text lacks %q:\n%s", want, text(res))
	}
}
