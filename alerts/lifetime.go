package alerts

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Lifetime event kinds: a lifetime rule is about to act on an instance
// (the two warnings) or has acted (stopped or destroyed it). They are the
// fleet's event kinds (fleet.EventIdleWarning and the others), spelled
// here because alerts does not import the fleet, which pulls in the
// provider clients; a test keeps the two lists equal.
const (
	LifetimeIdleWarning = "instance.idle_warning" // an idle timeout acts within the warning lead
	LifetimeExpiring    = "instance.expiring"     // max_duration or spend_cap acts within the warning lead
	LifetimeStopped     = "instance.stopped"      // a rule stopped the instance (disk kept)
	LifetimeDestroyed   = "instance.destroyed"    // a rule destroyed the instance
)

// LifetimeNotice is one warning or action of a lifetime rule, as the fleet
// reports it (fleet.LifetimeEvent): the instance (for an action, as it is
// after it), the rule, what it does or did, and At: when it acts (a
// warning) or acted.
type LifetimeNotice struct {
	Kind     string
	Instance gpuproxy.Instance
	Rule     gpuproxy.LifetimeRule
	Action   gpuproxy.IdleAction
	At       time.Time
}

// warning reports whether n is about to act (else it acted).
func (n LifetimeNotice) warning() bool {
	return n.Kind == LifetimeIdleWarning || n.Kind == LifetimeExpiring
}

// validate reports what in n an event cannot be made of.
func (n LifetimeNotice) validate() error {
	switch n.Kind {
	case LifetimeIdleWarning, LifetimeExpiring, LifetimeStopped, LifetimeDestroyed:
	default:
		return fmt.Errorf("lifetime notice: unknown kind %q", n.Kind)
	}
	switch {
	case n.Instance.ID == "" || n.Instance.AccountID == 0:
		return fmt.Errorf("lifetime notice %s: no instance id or account", n.Kind)
	case n.Rule == "":
		return fmt.Errorf("lifetime notice %s of %s: no rule", n.Kind, n.Instance.ID)
	case n.At.IsZero():
		return fmt.Errorf("lifetime notice %s of %s: no time", n.Kind, n.Instance.ID)
	}
	return nil
}

// dedupKey is the notice's outbox key, so that each is recorded once
// whichever replicas report it: an action once per instance and kind (an
// instance leaves running once); a warning once per rule and acting time
// — an idle period's warning acts at its start plus the timeout, so a new
// period (activity, a keep-alive) or new settings warn anew — and, for a
// spend cap, whose acting time moves with the spend rate, once per cap.
func (n LifetimeNotice) dedupKey() string {
	k := "lifetime/" + n.Instance.ID + "/" + n.Kind
	if !n.warning() {
		return k
	}
	k += "/" + string(n.Rule) + "/"
	if n.Rule == gpuproxy.RuleSpendCap {
		return k + "cap/" + strconv.FormatInt(int64(n.Instance.Lifetime.SpendCap), 10)
	}
	return k + strconv.FormatInt(n.At.UnixMicro(), 10)
}

// idleSince is when the instance's idleness began: the later of its start
// plus its idle grace and its last activity (the fleet's idle period).
func idleSince(inst gpuproxy.Instance) time.Time {
	since := inst.StartedAt.Add(inst.Lifetime.IdleGrace)
	if inst.LastActivityAt.After(since) {
		since = inst.LastActivityAt
	}
	return since
}

// LifetimeEvent is the event of n, a lifetime rule of an instance of
// account warning or acting, recorded at.
func LifetimeEvent(accountID int64, account string, n LifetimeNotice, at time.Time) (gpuproxy.AlertEvent, error) {
	if err := n.validate(); err != nil {
		return gpuproxy.AlertEvent{}, err
	}
	inst, l := n.Instance, n.Instance.Lifetime
	when := n.At.UTC()
	p := Payload{ID: newEventID(), Type: n.Kind, CreatedAt: at.UTC(), Account: account, InstanceID: inst.ID,
		Provider: inst.Provider, GPUName: inst.GPUName, NumGPUs: inst.NumGPUs, Rule: string(n.Rule),
		Action: string(n.Action), MaxDuration: durationText(l.MaxDuration), IdleTimeout: durationText(l.IdleTimeout)}
	switch n.Kind {
	case LifetimeStopped:
		p.Action = string(gpuproxy.IdleStop)
	case LifetimeDestroyed:
		p.Action = string(gpuproxy.IdleDestroy)
	}
	if l.SpendCap > 0 {
		c := l.SpendCap
		p.SpendCap = &c
	}
	if n.warning() {
		p.ActsAt = &when
	} else {
		p.ActedAt = &when
	}
	if !inst.LastActivityAt.IsZero() {
		last := inst.LastActivityAt.UTC()
		p.LastActivityAt = &last
	}
	if !inst.StartedAt.IsZero() {
		started := inst.StartedAt.UTC()
		p.StartedAt = &started
	}
	if n.Rule == gpuproxy.RuleIdle && !inst.StartedAt.IsZero() {
		since := idleSince(inst).UTC()
		p.IdleSince = &since
	}
	p.Text = lifetimeText(account, n, p)
	return event(accountID, p, 0)
}

// lifetimeText says n in one sentence or two: "gpuproxy: instance gpi_…
// (RTX 4090 on vastai) of account acme idles since 12:00 UTC; it will be
// stopped at 12:30 UTC (idle_timeout 30m). …".
func lifetimeText(account string, n LifetimeNotice, p Payload) string {
	inst, l := n.Instance, n.Instance.Lifetime
	who := "instance " + inst.ID
	if gpu := gpuText(inst); gpu != "" {
		who += " (" + gpu + ")"
	}
	who += " of account " + account
	verb := "destroyed"
	if p.Action == string(gpuproxy.IdleStop) {
		verb = "stopped"
	}
	at := clock(n.At)
	var b strings.Builder
	b.WriteString("gpuproxy: ")
	if n.warning() {
		switch n.Rule {
		case gpuproxy.RuleIdle:
			fmt.Fprintf(&b, "%s idles since %s; it will be %s at %s (idle_timeout %s). A proxied request or "+
				"POST /api/v1/gpu/instances/%s/keepalive keeps it.", who, sinceText(p.IdleSince, n.At), verb, at,
				shortDuration(l.IdleTimeout), inst.ID)
		case gpuproxy.RuleMaxDuration:
			fmt.Fprintf(&b, "%s runs since %s; it will be %s at %s (max_duration %s).", who, sinceText(p.StartedAt, n.At),
				verb, at, shortDuration(l.MaxDuration))
		case gpuproxy.RuleSpendCap:
			fmt.Fprintf(&b, "%s will be %s at %s, before its cost passes its spend_cap of %s.", who, verb, at,
				usd(l.SpendCap))
		default:
			fmt.Fprintf(&b, "%s will be %s at %s (%s).", who, verb, at, n.Rule)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "%s was %s at %s by its ", who, verb, at)
	switch n.Rule {
	case gpuproxy.RuleIdle:
		fmt.Fprintf(&b, "idle_timeout (%s; idle since %s).", shortDuration(l.IdleTimeout), sinceText(p.IdleSince, n.At))
	case gpuproxy.RuleMaxDuration:
		fmt.Fprintf(&b, "max_duration (%s; running since %s).", shortDuration(l.MaxDuration), sinceText(p.StartedAt, n.At))
	case gpuproxy.RuleSpendCap:
		fmt.Fprintf(&b, "spend_cap (%s).", usd(l.SpendCap))
	default:
		fmt.Fprintf(&b, "%s.", n.Rule)
	}
	if n.Kind == LifetimeStopped {
		b.WriteString(" Its disk is kept; gpuproxy bills it no more (the provider may bill the storage).")
	}
	return b.String()
}

// gpuText is "2x RTX 4090 on vastai", "RTX 4090 on vastai" or "vastai".
func gpuText(inst gpuproxy.Instance) string {
	switch {
	case inst.GPUName == "":
		return inst.Provider
	case inst.NumGPUs > 1:
		return fmt.Sprintf("%dx %s on %s", inst.NumGPUs, inst.GPUName, inst.Provider)
	case inst.Provider == "":
		return inst.GPUName
	}
	return inst.GPUName + " on " + inst.Provider
}

// sinceText renders the start of a period ending at ref: its time of day,
// with its date when that is another day than ref's.
func sinceText(t *time.Time, ref time.Time) string {
	if t == nil {
		return "its start"
	}
	if day := t.UTC().Format("2006-01-02"); day != ref.UTC().Format("2006-01-02") {
		return day + " " + clock(*t)
	}
	return clock(*t)
}

// clock renders a time of day in UTC for people: "12:30 UTC", or
// "12:30:15 UTC" when it has seconds (short rules act within the minute).
func clock(t time.Time) string {
	t = t.UTC().Truncate(time.Second)
	if t.Second() == 0 {
		return t.Format("15:04 UTC")
	}
	return t.Format("15:04:05 UTC")
}

// shortDuration renders d as people write it: "30m", "8h", "1h30m", "10s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// durationText is d as Go writes it (the instance JSON's form), "" for none.
func durationText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}
