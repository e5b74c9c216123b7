package takeover_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/takeover"
	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestBuffersHeldOnlyWhileNeeded: a taken-over connection waiting for its
// next request holds its read buffer only (no write buffer), and one
// whose request (without a body) is still running and has written
// nothing holds neither; both are taken again to serve.
func TestBuffersHeldOnlyWhileNeeded(t *testing.T) {
	t.Parallel()
	rt := newRoot()
	hs := httptest.NewServer(rt)
	defer hs.Close()
	c := dial(t, hs)
	for _, p := range []string{"/x/a", "/x/b"} {
		c.send(p)
		if got, err := c.read(); err != nil || got != p+" by takeover" && p != "/x/a" {
			t.Fatalf("%s: %q, %v", p, got, err)
		}
	}
	if rt.conns.Len() != 1 {
		t.Fatalf("%d connections taken over, want 1", rt.conns.Len())
	}
	testpoll.Until(t, 5*time.Second, "the idle connection gives its write buffer back", func() bool {
		return takeover.BuffersHeld(rt.conns) == 1
	})
	c.send("/x/hold")
	<-rt.held
	testpoll.Until(t, 5*time.Second, "the running request holds no buffer", func() bool {
		return takeover.BuffersHeld(rt.conns) == 0
	})
	rt.hold <- struct{}{}
	if got, err := c.read(); err != nil || got != "/x/hold by takeover" {
		t.Fatalf("/x/hold: %q, %v", got, err)
	}
	c.send("/x/c")
	if got, err := c.read(); err != nil || got != "/x/c by takeover" {
		t.Fatalf("/x/c: %q, %v", got, err)
	}
}
