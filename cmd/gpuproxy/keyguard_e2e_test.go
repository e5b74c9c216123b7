package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// TestSandboxKeyWindowAndConfirmation, over REST on `serve --sandbox`: a
// key created with --window 60m=1 is refused (402, naming the key's window)
// an instance over $1/hour that the account's limit allows; a key with
// --confirm-above gets 428 confirmation_required with a token, and the same
// create with confirm_token proceeds.
func TestSandboxKeyWindowAndConfirmation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": "sqlite:" + filepath.Join(dir, "kg.db"), "GPUPROXY_LOG_LEVEL": "warn",
		"GPUPROXY_RATE_LIMIT": "0"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--sandbox", "--listen", "127.0.0.1:0"}, envFunc(env),
			strings.NewReader(""), stdout, stderr)
	}()
	base := waitListening(t, stdout, done)
	var admin string
	testpoll.Wait(5*time.Second, func() bool {
		if m := regexp.MustCompile(`GPUPROXY_ADMIN_KEY=(\S+)`).FindStringSubmatch(stdout.String()); m != nil {
			admin = m[1]
		}
		return admin != ""
	})
	if admin == "" {
		t.Fatalf("no admin key printed: %s", stdout.String())
	}
	c := client{t: t, base: base}
	if st, lim := c.call("PUT", "/api/v1/accounts/demo/limits", admin, `{"windows":[{"window_minutes":60,"limit":100}]}`); st != 200 {
		t.Fatalf("limits: %d %v", st, lim)
	}
	st, k := c.call("POST", "/api/v1/accounts/demo/keys", admin,
		`{"preset":"assistant","name":"tight","windows":[{"window_minutes":60,"limit":1}]}`)
	if st != 201 {
		t.Fatalf("key: %d %v", st, k)
	}
	tight := k["key"].(string)
	_, offers := c.call("GET", "/api/v1/gpu/offers?provider=vast.ai&limit=500", tight, "")
	var over, cheap string
	for _, o := range offers["offers"].([]any) {
		om := o.(map[string]any)
		if p := micros(om["price_per_hour"]); p > 1_000_000 && p < 50_000_000 && over == "" {
			over = om["offer_id"].(string)
		} else if p < 500_000 && cheap == "" {
			cheap = om["offer_id"].(string)
		}
	}
	if over == "" || cheap == "" {
		t.Fatalf("no offers over $1/hour and under $0.50/hour: %v", offers)
	}
	create := func(key, offer, extra string) (int, map[string]any) {
		return c.call("POST", "/api/v1/gpu/instances", key,
			fmt.Sprintf(`{"provider":"vast.ai","offer_id":%q,"image":"vllm/vllm-openai:latest"%s}`, offer, extra))
	}
	st, e := create(tight, over, "")
	det, _ := e["error"].(map[string]any)["details"].(map[string]any)
	if st != 402 || det["scope"] != "key" || det["key_id"] != k["id"] || det["window_minutes"] != float64(60) {
		t.Fatalf("over the key's $1 window: %d %v", st, e)
	}

	st, k = c.call("POST", "/api/v1/accounts/demo/keys", admin, `{"preset":"assistant","name":"careful","confirm_above":0.05}`)
	if st != 201 || k["confirm_above"] != 0.05 {
		t.Fatalf("key: %d %v", st, k)
	}
	careful := k["key"].(string)
	st, e = create(careful, cheap, "")
	det, _ = e["error"].(map[string]any)["details"].(map[string]any)
	tok, _ := det["confirm_token"].(string)
	if st != 428 || e["error"].(map[string]any)["code"] != "confirmation_required" || tok == "" {
		t.Fatalf("above confirm_above: %d %v", st, e)
	}
	if st, inst := create(careful, cheap, `,"confirm_token":"`+tok+`"`); st != 201 && st != 202 {
		t.Fatalf("with the token: %d %v", st, inst)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v\n%s", err, stderr.String())
	}
}
