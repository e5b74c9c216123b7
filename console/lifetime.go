package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/fleet"
)

// lifetimeFacts is what the instance page shows of its lifetime rules
// (gpuproxy.Lifetime) and of what acts on it next (fleet.Schedule). The
// console allows no script, so the countdown is the time left when the
// page was rendered, beside the absolute time.
type lifetimeFacts struct {
	IdleTimeout string // "30m", "" for none
	IdleAction  gpuproxy.IdleAction
	IdleGrace   string
	MaxDuration string
	SpendCap    gpuproxy.Micros
	// LastActivity is the last proxied request or keepalive (zero: none
	// yet); IdleFor how long the idle timeout's clock has run ("" when it
	// does not run).
	LastActivity time.Time
	IdleFor      string
	// ActsAt, Rule, Action: the next rule to act; Countdown says it for
	// people: "stops in 4m32s".
	ActsAt    time.Time
	Rule      gpuproxy.LifetimeRule
	Action    gpuproxy.IdleAction
	Countdown string
	// ActedRule and ActedAt: the rule that stopped or destroyed it.
	ActedRule gpuproxy.LifetimeRule
	ActedAt   time.Time
	// KeepAlive: a running instance with an idle timeout, which a keep
	// alive restarts.
	KeepAlive bool
}

func newLifetimeFacts(v fleet.View, now time.Time) lifetimeFacts {
	l := v.Lifetime
	f := lifetimeFacts{IdleTimeout: ruleDuration(l.IdleTimeout), IdleAction: l.IdleAction, IdleGrace: ruleDuration(l.IdleGrace),
		MaxDuration: ruleDuration(l.MaxDuration), SpendCap: l.SpendCap, LastActivity: v.LastActivityAt,
		ActedRule: v.ActedRule, ActedAt: v.ActedAt,
		KeepAlive: l.IdleTimeout > 0 && (v.Status == gpuproxy.Running || v.Status == gpuproxy.Starting)}
	if f.IdleGrace == "" {
		f.IdleGrace = "0s"
	}
	if sc := v.Schedule; !sc.At.IsZero() {
		f.ActsAt, f.Rule, f.Action = sc.At, sc.Rule, sc.Action
		verb := "is destroyed"
		if sc.Action == gpuproxy.IdleStop {
			verb = "stops"
		}
		f.Countdown = verb + " in " + countdown(sc.At.Sub(now))
		if l.IdleTimeout > 0 {
			f.IdleFor = countdown(sc.IdleFor)
		}
	}
	return f
}

// ruleDuration renders a rule's duration as people write it: "30m",
// "8h", "1h30m", "20s"; "" for none.
func ruleDuration(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// countdown renders the time left to the second under an hour ("4m32s",
// "45s"), to the minute under two days ("2h05m"), else in days and hours;
// "0s" when it is due.
func countdown(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d <= 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	return fmt.Sprintf("%dd %dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// keepAlive counts now as activity on one instance through the fleet
// service, as POST /api/v1/gpu/instances/{id}/keepalive does
// (instances:write): its idle timeout starts over.
func (c *Console) keepAlive(q *req) error {
	if err := c.needFleet(); err != nil {
		return err
	}
	acct, name, err := c.target(q)
	if err != nil {
		return err
	}
	v, err := c.svc.Fleet.KeepAlive(q.r.Context(), acct, q.r.PathValue("id"))
	if err != nil {
		return err
	}
	to := "/console/instances/" + url.PathEscape(v.ID) + "?done=keepalive"
	if name != q.p.AccountName {
		to += "&account=" + url.QueryEscape(name)
	}
	http.Redirect(q.w, q.r, to, http.StatusSeeOther)
	return nil
}
