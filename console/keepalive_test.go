package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestInstanceLifetime: the instance page shows the running instance's
// rules and the rule that acts next, as the API has them; Keep alive
// (instances:write, with the form's CSRF token) moves its last activity
// and says so; without the token, with a finance key or on an ended
// instance it changes nothing.
func TestInstanceLifetime(t *testing.T) {
	s := newStack(t, stackOpts{})
	eng := s.keys["engineer"]
	c := s.signIn(eng)
	page := "/console/instances/" + s.running.ID
	st, body := s.get(c, page)
	if st != http.StatusOK {
		t.Fatalf("instance page: %d", st)
	}
	api := s.api(eng, "/api/v1/gpu/instances/"+s.running.ID)
	// The service's default: an idle timeout of 60 minutes, stopping the
	// vast.ai instance.
	if api["rule"] != "idle_timeout" || api["idle_timeout"] != "1h0m0s" || api["action"] != "stop" || api["last_activity_at"] != nil {
		t.Fatalf("API: rule %v, idle_timeout %v, action %v, last activity %v", api["rule"], api["idle_timeout"], api["action"],
			api["last_activity_at"])
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`<p class="countdown" id="countdown" data-rule="idle_timeout" data-action="stop">It <strong data-field="countdown">stops in 1h[01]\dm</strong> \(<span data-field="rule">idle_timeout</span>\) · at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</p>`),
		regexp.MustCompile(`<dd id="rule-idle">1h, then stop <span class="muted">\(counted 10m after it started running\)</span></dd>`),
		regexp.MustCompile(`<dd id="rule-max">none</dd>`),
		regexp.MustCompile(`<dd id="last-activity">none yet</dd>`),
		regexp.MustCompile(`<dd id="idle-for">\d+s</dd>`),
		regexp.MustCompile(`<button class="secondary" id="keep-alive">Keep alive</button>`),
	} {
		if !want.MatchString(body) {
			t.Errorf("instance page lacks %s", want)
		}
	}
	acts, _ := time.Parse(time.RFC3339Nano, api["acts_at"].(string))
	if !strings.Contains(body, "at "+acts.UTC().Format(time.DateTime)+" UTC</p>") {
		t.Errorf("countdown does not end at the API's acts_at %s", acts)
	}

	post := func(c *http.Client, path string, v url.Values) *http.Response {
		t.Helper()
		res, err := c.PostForm(s.url+path, v)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	lastActivity := func() any { return s.api(eng, "/api/v1/gpu/instances/"+s.running.ID)["last_activity_at"] }
	keep := page + "/keepalive"
	if res := post(c, keep, url.Values{"csrf": {"forged"}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("keep alive with a wrong CSRF token: %d, want 403", res.StatusCode)
	}
	fin := s.signIn(s.keys["finance"])
	_, finBody := s.get(fin, "/console/")
	if res := post(fin, keep, url.Values{"csrf": {csrfOf(t, finBody)}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("keep alive by a finance key: %d, want 403", res.StatusCode)
	}
	if got := lastActivity(); got != nil {
		t.Fatalf("refused keep alives moved last activity to %v", got)
	}

	before := time.Now().Add(-time.Millisecond)
	res := post(c, keep, url.Values{"csrf": {csrfOf(t, body)}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != page+"?done=keepalive" {
		t.Fatalf("keep alive: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	la, _ := lastActivity().(string)
	at, err := time.Parse(time.RFC3339Nano, la)
	if err != nil || at.Before(before) {
		t.Fatalf("last activity after keep alive: %q, want at or after %s", la, before)
	}
	_, body = s.get(c, page+"?done=keepalive")
	if !strings.Contains(body, "Kept alive: its idle timeout starts over from now. It stops in ") ||
		!strings.Contains(body, `<dd id="last-activity" data-time="`+at.UTC().Format("2006-01-02T15:04:05.000000Z07:00")+`">`) {
		t.Errorf("page after keep alive: flash or last activity missing:\n%s", body)
	}
	v, err := s.fleet.Get(context.Background(), s.demo.ID, s.running.ID)
	if err != nil || !v.LastActivityAt.Equal(at) {
		t.Errorf("stored last activity %v, API %v (%v)", v.LastActivityAt, at, err)
	}

	// The ended io.net deployment: no button, and a form posted anyway is
	// a conflict.
	_, body = s.get(c, "/console/instances/"+s.ended.ID)
	if strings.Contains(body, "keep-alive") || strings.Contains(body, `id="countdown"`) {
		t.Errorf("ended instance offers keep alive or a countdown")
	}
	if res := post(c, "/console/instances/"+s.ended.ID+"/keepalive", url.Values{"csrf": {csrfOf(t, body)}}); res.StatusCode != http.StatusConflict {
		t.Errorf("keep alive of an ended instance: %d, want 409", res.StatusCode)
	}
}
