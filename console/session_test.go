package console

import (
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

func TestSessionToken(t *testing.T) {
	t.Parallel()
	s := sessions{secret: []byte("secret one"), idle: time.Hour, max: 12 * time.Hour}
	t0 := time.Unix(1_800_000_000, 0)
	ss := s.start("0123456789abcdef", t0)
	tok := s.encode(ss)
	if got, ok := s.decode(tok, t0.Add(59*time.Minute)); !ok || got != ss {
		t.Fatalf("decode within the hour: %v %+v", ok, got)
	}
	payload, sig, _ := strings.Cut(tok, ".")
	forged := b64.EncodeToString([]byte(`{"k":"fedcba9876543210","s":1800000000,"e":1900000000,"n":"x"}`))
	for name, bad := range map[string]string{
		"expired":         tok,
		"other secret":    sessions{secret: []byte("secret two"), idle: time.Hour, max: 12 * time.Hour}.encode(ss),
		"forged payload":  forged + "." + sig,
		"payload flipped": payload[:len(payload)-1] + "A." + sig,
		"no signature":    payload,
		"empty":           "",
		"huge":            strings.Repeat("a", 2000) + "." + sig,
	} {
		at := t0.Add(time.Minute)
		if name == "expired" {
			at = t0.Add(time.Hour)
		}
		if _, ok := s.decode(bad, at); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	// Renewal extends by the idle time while used, never past the whole life.
	if s.needsRenewal(ss, t0.Add(10*time.Minute)) {
		t.Error("renewal needed after 10 minutes of an hour")
	}
	at := t0
	for i := 0; i < 30; i++ {
		at = at.Add(40 * time.Minute)
		got, ok := s.decode(s.encode(ss), at)
		if at.Sub(t0) >= 12*time.Hour {
			if ok {
				t.Fatalf("session alive %s after sign-in", at.Sub(t0))
			}
			break
		}
		if !ok {
			t.Fatalf("session used every 40 minutes ended after %s", at.Sub(t0))
		}
		if s.needsRenewal(got, at) {
			ss = s.renewed(got, at)
		}
	}
	if time.Unix(ss.Exp, 0).After(t0.Add(12 * time.Hour)) {
		t.Errorf("renewed past the session's whole life: %v", time.Unix(ss.Exp, 0).Sub(t0))
	}
}

func TestCSRFToken(t *testing.T) {
	t.Parallel()
	s := sessions{secret: []byte("k"), idle: time.Hour, max: time.Hour}
	a, b := s.start("0123456789abcdef", time.Now()), s.start("0123456789abcdef", time.Now())
	if !s.checkCSRF(a, s.csrf(a)) {
		t.Fatal("own token refused")
	}
	for name, tok := range map[string]string{"another session's": s.csrf(b), "empty": "", "garbage": "!!!",
		"other secret": sessions{secret: []byte("j")}.csrf(a)} {
		if s.checkCSRF(a, tok) {
			t.Errorf("%s token accepted", name)
		}
	}
	if strings.Contains(s.encode(a), s.csrf(a)) {
		t.Error("the CSRF token is readable from the cookie")
	}
}

func TestReach(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	w := func(spent, held gpuproxy.Micros) guardrails.Usage {
		return guardrails.Usage{Window: guardrails.Window{Minutes: 1440, Limit: 100 * gpuproxy.MicrosPerUSD}, Spent: spent, Held: held}
	}
	u := gpuproxy.Micros(gpuproxy.MicrosPerUSD)
	for _, tc := range []struct {
		u    guardrails.Usage
		burn gpuproxy.Micros
		want string
	}{
		{w(100*u, 0), 5 * u, "The limit is reached"},
		{w(90*u, 10*u), 5 * u, "Spent and held together reach the limit"},
		{w(50*u, 0), 0, "Nothing is burning"},
		// $50 left at $5/h: 10 h, inside the 24 h window.
		{w(50*u, 0), 5 * u, "At this rate the limit is reached at 2026-11-25 22:00 UTC (in 10h 0m) at the earliest."},
		// $50 left at $2/h: 25 h, beyond the window; a whole window of it is $48.
		{w(50*u, 0), 2 * u, "At this rate the limit is not reached: a whole 1440-minute window at $2.00 per hour " +
			"costs $48.00, less than the $50.00 between spent + held and the limit."},
	} {
		if got := reach(tc.u, tc.burn, at); !strings.HasPrefix(got, tc.want) {
			t.Errorf("spent %s held %s burn %s: %q, want %q", tc.u.Spent, tc.u.Held, tc.burn, got, tc.want)
		}
	}
}

func TestWindowBarLevels(t *testing.T) {
	t.Parallel()
	u := gpuproxy.Micros(gpuproxy.MicrosPerUSD)
	for _, tc := range []struct {
		limit, spent, held, committed gpuproxy.Micros
		level                         string
		pct                           int
	}{
		{50 * u, 10 * u, 0, 0, "ok", 20},
		{50 * u, 30 * u, 5 * u, 5 * u, "warn", 80},
		{50 * u, 50 * u, 0, 0, "over", 100},
		{50 * u, 40 * u, 0, 20 * u, "over", 120},
		{0, 0, 0, 0, "ok", 0},
		{0, 1, 0, 0, "over", 999},
	} {
		svg, level, pct := windowBar(tc.limit, tc.spent, tc.held, tc.committed)
		if level != tc.level || pct != tc.pct || !strings.HasPrefix(string(svg), "<svg") {
			t.Errorf("%+v: %s %d%%", tc, level, pct)
		}
		if tc.spent+tc.held+tc.committed > tc.limit && tc.limit > 0 && !strings.Contains(string(svg), `class="limit"`) {
			t.Errorf("%+v: no limit mark on a bar past its limit", tc)
		}
	}
}

func TestSpendChart(t *testing.T) {
	t.Parallel()
	svg := string(spendChart(`spend <"x">`, []bucket{{Label: "a<b", Title: "t&", Spend: 12_340_000}, {Spend: -2_000_000}, {}}))
	for _, want := range []string{`aria-label="spend &lt;&#34;x&#34;&gt;"`, `a&lt;b`, `t&amp;: $12.34`, `data-spend="-2000000"`, `class="b neg"`} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %s: %s", want, svg)
		}
	}
	if strings.Contains(svg, "<b") || strings.Contains(svg, `"x"`) {
		t.Error("unescaped text in the chart")
	}
	for span, want := range map[gpuproxy.Micros]gpuproxy.Micros{0: 10_000, 40_000: 10_000, 60_000: 20_000,
		24_500_000: 5_000_000, 1_000_000_000: 200_000_000} {
		if got := tickStep(span); got != want {
			t.Errorf("tickStep(%d) = %d, want %d", span, got, want)
		}
	}
}
