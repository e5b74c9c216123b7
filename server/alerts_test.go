package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// TestAlertsAPI: PUT /api/v1/accounts/{account}/alerts (admin) answers
// the signing secret once, validates naming the field; GET
// /api/v1/alerts/deliveries lists the caller's own deliveries (admins any
// account's).
func TestAlertsAPI(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{limits: []guardrails.Window{{Minutes: 60, Limit: 100 * usd}}})
		al := e.app.Alerts
		admin, _ := e.key("ops", "admin")
		eng, acme := e.key("acme", "engineer")
		fin, _ := e.key("acme", "finance")
		const path = "/api/v1/accounts/acme/alerts"

		if r := e.do("PUT", path, eng, `{"webhook_url":"https://hooks.example.com/x"}`); r.Status != 403 {
			t.Fatalf("engineer PUT: %d %s", r.Status, r.Body)
		}
		if r := e.do("PUT", "/api/v1/accounts/nope/alerts", admin, `{"webhook_url":"https://hooks.example.com/x"}`); r.Status != 404 {
			t.Fatalf("unknown account: %d %s", r.Status, r.Body)
		}
		for _, c := range []struct{ body, field string }{
			{`{}`, "webhook_url"},
			{`{"webhook_url":"ftp://hooks.example.com/x"}`, "webhook_url"},
			{`{"webhook_url":"http://127.0.0.1:9/x"}`, "webhook_url"},
			{`{"webhook_url":"http://169.254.169.254/latest"}`, "webhook_url"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[]}`, "thresholds"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[0.8,0.5]}`, "thresholds[1]"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[0.5,0.5]}`, "thresholds[1]"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[0]}`, "thresholds[0]"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[10.5]}`, "thresholds[0]"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":[1,2,3,4,5,6,7,8,9,9.5,10]}`, "thresholds"},
			{`{"webhook_url":"https://hooks.example.com/x","thresholds":"0.5"}`, "thresholds"},
			{`{"webhook_url":"https://hooks.example.com/x","secret":"mine"}`, "secret"},
		} {
			r := e.do("PUT", path, admin, c.body)
			code, msg := r.Err(t)
			field, _ := r.JSON(t)["error"].(map[string]any)["details"].(map[string]any)["field"].(string)
			if r.Status != 400 || code != gpuproxy.EINVALID || field != c.field || !strings.HasPrefix(msg, c.field) {
				t.Errorf("%s: %d %s, want 400 naming %s", c.body, r.Status, r.Body, c.field)
			}
		}

		// Created: the secret is shown once, thresholds default.
		r := e.do("PUT", path, admin, `{"webhook_url":"https://hooks.example.com/x"}`)
		m := r.JSON(t)
		secret, _ := m["secret"].(string)
		if r.Status != 200 || !strings.HasPrefix(secret, "whsec_") || m["account"] != "acme" ||
			m["webhook_url"] != "https://hooks.example.com/x" || fmt.Sprint(m["thresholds"]) != "[0.5 0.8 1]" {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		// Updated: the secret is kept and not shown.
		r = e.do("PUT", path, admin, `{"webhook_url":"https://hooks.example.com/y","thresholds":[0.25,0.9]}`)
		m = r.JSON(t)
		if _, ok := m["secret"]; r.Status != 200 || ok || fmt.Sprint(m["thresholds"]) != "[0.25 0.9]" ||
			strings.Contains(string(r.Body), secret) {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		cfg, err := e.store.AlertConfig(context.Background(), acme.ID)
		if err != nil || cfg.Secret != secret || cfg.WebhookURL != "https://hooks.example.com/y" {
			t.Fatalf("stored: %+v %v", cfg, err)
		}
		// Rotated: a new secret, shown once.
		r = e.do("PUT", path, admin, `{"webhook_url":"https://hooks.example.com/y","thresholds":[0.5],"rotate_secret":true}`)
		rotated, _ := r.JSON(t)["secret"].(string)
		if r.Status != 200 || !strings.HasPrefix(rotated, "whsec_") || rotated == secret {
			t.Fatalf("rotate: %d %s", r.Status, r.Body)
		}

		// Deliveries: an account sees its own.
		const list = "/api/v1/alerts/deliveries"
		r = e.do("GET", list, eng, "")
		if r.Status != 200 || fmt.Sprint(r.JSON(t)["deliveries"]) != "[]" {
			t.Fatalf("empty list: %d %s", r.Status, r.Body)
		}
		if _, _, err := e.store.AppendEntry(context.Background(), billing.Entry{AccountID: acme.ID, Type: billing.Charge,
			Amount: 60 * usd, At: time.Now(), Basis: billing.Manual}); err != nil {
			t.Fatal(err)
		}
		if evs, err := al.Evaluate(context.Background()); err != nil || len(evs) != 1 {
			t.Fatalf("Evaluate: %v %v", evs, err)
		}
		for _, key := range []string{eng, fin} {
			r = e.do("GET", list, key, "")
			ds, _ := r.JSON(t)["deliveries"].([]any)
			if r.Status != 200 || len(ds) != 1 {
				t.Fatalf("list: %d %s", r.Status, r.Body)
			}
			d := ds[0].(map[string]any)
			p, _ := d["payload"].(map[string]any)
			if d["type"] != gpuproxy.AlertThresholdCrossed || d["status"] != gpuproxy.AlertPending || d["threshold"] != 0.5 ||
				d["window_minutes"] != 60.0 || d["attempts"] != 0.0 || p == nil || p["id"] != d["event_id"] ||
				!strings.Contains(p["text"].(string), "50%") {
				t.Fatalf("delivery: %s", r.Body)
			}
		}
		if r = e.do("GET", list+"?status=delivered", eng, ""); r.Status != 200 || fmt.Sprint(r.JSON(t)["deliveries"]) != "[]" {
			t.Fatalf("delivered: %d %s", r.Status, r.Body)
		}
		// Admins name the account; others cannot.
		if r = e.do("GET", list+"?account=acme", admin, ""); r.Status != 200 || len(r.JSON(t)["deliveries"].([]any)) != 1 {
			t.Fatalf("admin: %d %s", r.Status, r.Body)
		}
		if r = e.do("GET", list, admin, ""); r.Status != 200 || len(r.JSON(t)["deliveries"].([]any)) != 0 {
			t.Fatalf("admin's own: %d %s", r.Status, r.Body)
		}
		if r = e.do("GET", list+"?account=ops", eng, ""); r.Status != 404 {
			t.Fatalf("another account: %d %s", r.Status, r.Body)
		}
		offers, _, err := e.auth.CreateKey(context.Background(), "acme", "offers", []gpuproxy.Scope{gpuproxy.ScopeOffersRead})
		if err != nil {
			t.Fatal(err)
		}
		if r = e.do("GET", list, offers, ""); r.Status != 403 {
			t.Fatalf("without spending:read: %d %s", r.Status, r.Body)
		}
		for q, field := range map[string]string{"status=bogus": "status", "limit=x": "limit", "limit=501": "limit",
			"limit=-1": "limit", "before=x": "before"} {
			r = e.do("GET", list+"?"+q, eng, "")
			if d, _ := r.JSON(t)["error"].(map[string]any)["details"].(map[string]any); r.Status != 400 || d["field"] != field {
				t.Errorf("%s: %d %s, want 400 naming %s", q, r.Status, r.Body, field)
			}
		}
		// The secret is never logged.
		if strings.Contains(e.logs.String(), secret) || strings.Contains(e.logs.String(), rotated) {
			t.Fatal("a signing secret was logged")
		}
	})
}
