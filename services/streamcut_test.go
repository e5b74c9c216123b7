package services_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/services"
)

// TestPreemptionCutsAStreamWithAnErrorEvent: a token stream whose
// replica is preempted mid-way ends with an SSE error event the client
// reads (not a connection cut mid-body, nor a [DONE]), and the
// replacements serve.
func TestPreemptionCutsAStreamWithAnErrorEvent(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{catalog: spotCatalog(), chunk: 300 * time.Millisecond,
		market: &vastaisim.Market{Tick: 50 * time.Millisecond}})
	s.create(`{"name":"cut","model":"cut-m","spec":{"gpu":"RTX 4090","max_price_per_hour":1,"providers":"vast.ai"},` +
		`"image":"img","port":8000,"replicas":{"min":1},"placement":"interruptible"}`)
	v := s.waitReady("cut", 2, 20*time.Second)
	req, _ := http.NewRequest(http.MethodPost, s.bases[0]+"/v1/chat/completions",
		strings.NewReader(`{"model":"cut-m","stream":true,"messages":[{"role":"user","content":"one two three four five"}]}`))
	req.Header.Set("Authorization", "Bearer "+s.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || res.StatusCode != 200 || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("stream start: %d %q %v", res.StatusCode, first, err)
	}
	// Preempt both replicas (the simulator stops their inference servers
	// at once): the stream's is one of them.
	for _, r := range v.Instances {
		if err := s.sim.Preempt(s.simID(r.InstanceID), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := io.ReadAll(br)
	body := first + string(rest)
	if err != nil {
		t.Fatalf("the stream was cut without an error event (%v): %q", err, body)
	}
	if !strings.Contains(body, "\ndata: {\"error\":") || strings.Contains(body, "[DONE]") {
		t.Fatalf("want the stream to end with an error event, got %q", body)
	}
	// The replacements serve.
	s.waitFor("cut", "two replacements ready", 20*time.Second, func(nv services.View) bool {
		for _, r := range v.Instances {
			if o, ok := replicaOf(nv, r.InstanceID); !ok || o.Reason != "preempted" {
				return false
			}
		}
		return readyCount(nv, "interruptible") == 2
	})
	// (the routers' tables may hold the preempted ones a moment longer)
	var st int
	var b []byte
	if !testpoll.Wait(5*time.Second, func() bool { st, b = s.chat(0, "cut-m", false); return st == 200 }) {
		t.Fatalf("chat after the preemption: %d %s", st, b)
	}
}

// TestPreemptedRequestIsRetried: requests waiting on a replica's answer
// when its instance is preempted (nothing sent to the client yet) are
// retried on the other replica and answered.
func TestPreemptedRequestIsRetried(t *testing.T) {
	s := newStack(t, dbtest.SQLite, stackOpts{catalog: spotCatalog(), market: &vastaisim.Market{Tick: 50 * time.Millisecond}})
	s.create(`{"name":"retry","model":"retry-m","spec":{"gpu":"RTX 4090","max_price_per_hour":1,"providers":"vast.ai"},` +
		`"image":"img","port":8000,"replicas":{"min":1},"placement":"interruptible"}`)
	v := s.waitReady("retry", 2, 20*time.Second)
	victim := s.simID(v.Instances[0].InstanceID)
	inf := s.sim.InstanceInference(victim)
	if inf == nil {
		t.Fatal("the replica has no inference server")
	}
	inf.SetHang(true) // its requests wait until it goes away
	before := inf.Requests()
	const n = 6
	type answer struct {
		status int
		body   []byte
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			st, b := s.chat(0, "retry-m", false)
			answers <- answer{st, b}
		}()
	}
	if !testpoll.Wait(10*time.Second, func() bool { return inf.Requests() > before }) {
		t.Fatal("no request reached the replica to preempt")
	}
	if err := s.sim.Preempt(victim, time.Hour); err != nil {
		t.Fatal(err)
	}
	for range n {
		if a := <-answers; a.status != 200 {
			t.Errorf("a request on the preempted replica was not retried: %d %s", a.status, a.body)
		}
	}
}
