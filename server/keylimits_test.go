package server_test

import (
	"testing"

	"github.com/aiserve/gpuproxy/db/dbtest"
)

// TestKeyLimitsAPI: a key created with windows shows them in the keys
// list, PUT /api/v1/keys/{key_id}/limits replaces them (an empty list
// removes them), the key's own spending shows them beside the account's,
// and a check over the key's window is refused while the account allows it.
func TestKeyLimitsAPI(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newEnv(t, k, opts{})
		admin, _ := e.key("root", "admin")
		if r := e.do("POST", "/api/v1/accounts", admin, `{"name":"team-k"}`); r.Status != 201 {
			t.Fatalf("create account: %d %s", r.Status, r.Body)
		}
		r := e.do("POST", "/api/v1/accounts/team-k/keys", admin,
			`{"preset":"assistant","name":"bot","windows":[{"window_minutes":60,"limit":1}]}`)
		if r.Status != 201 {
			t.Fatalf("create key: %d %s", r.Status, r.Body)
		}
		j := r.JSON(t)
		bot, id := j["key"].(string), j["id"].(string)
		r = e.do("GET", "/api/v1/accounts/team-k/keys", admin, "")
		ks := r.JSON(t)["keys"].([]any)
		if len(ks) != 1 || len(ks[0].(map[string]any)["windows"].([]any)) != 1 {
			t.Fatalf("keys list: %s", r.Body)
		}
		r = e.do("GET", "/api/v1/spending", bot, "")
		key, _ := r.JSON(t)["key"].(map[string]any)
		if r.Status != 200 || key == nil || key["key_id"] != id || len(key["windows"].([]any)) != 1 {
			t.Fatalf("spending: %d %s", r.Status, r.Body)
		}
		r = e.do("POST", "/api/v1/spending/check", bot, `{"estimated_cost": 2}`)
		if j := r.JSON(t); r.Status != 200 || j["allowed"] != false || j["key"] == nil {
			t.Fatalf("check $2 against the key's $1: %d %s", r.Status, r.Body)
		}
		if r := e.do("PUT", "/api/v1/keys/"+id+"/limits", bot, `{"windows":[]}`); r.Status != 403 {
			t.Fatalf("a non-admin set key limits: %d", r.Status)
		}
		if r := e.do("PUT", "/api/v1/keys/"+id+"/limits", admin, `{"windows":[{"window_minutes":0,"limit":1}]}`); r.Status != 400 {
			t.Fatalf("bad window: %d %s", r.Status, r.Body)
		}
		if r := e.do("PUT", "/api/v1/keys/"+id+"/limits", admin, `{"windows":[]}`); r.Status != 200 {
			t.Fatalf("remove key windows: %d %s", r.Status, r.Body)
		}
		r = e.do("POST", "/api/v1/spending/check", bot, `{"estimated_cost": 2}`)
		if j := r.JSON(t); j["allowed"] != true || j["key"] != nil {
			t.Fatalf("check after removing the key's windows: %s", r.Body)
		}
	})
}
