package attack

import (
	"sort"
	"strconv"
	"strings"
)

// checkLedger: no duplicate entries and none lost.
func (s *dbState) checkLedger(v *violations) {
	keys := map[string]int{}
	prepaid := map[string][]ledgerRow{}
	refunds := map[string][]ledgerRow{}
	meterCharges := map[string][]ledgerRow{}
	stopRefunds := map[string]ledgerRow{} // meter id → the refund of time charged past its stop
	for _, e := range s.ledger {
		if e.key != "" {
			keys[strconv.FormatInt(e.account, 10)+"/"+e.key]++
		}
		switch {
		case e.typ == "charge" && e.basis == "prepaid":
			prepaid[e.instanceID] = append(prepaid[e.instanceID], e)
		case e.typ == "refund" && strings.HasPrefix(e.key, "lease:"):
			// A proxy lease's refunds (an amend, an expired lease's full
			// charge returned) belong to no instance; the token checks
			// hold them to the records.
		case e.typ == "refund" && strings.HasPrefix(e.key, "meter-stop:"):
			stopRefunds[strings.TrimPrefix(e.key, "meter-stop:")] = e
		case e.typ == "refund":
			refunds[e.instanceID] = append(refunds[e.instanceID], e)
		case e.typ == "charge" && strings.HasPrefix(e.key, "meter:"):
			id, _, _ := strings.Cut(strings.TrimPrefix(e.key, "meter:"), ":")
			meterCharges[id] = append(meterCharges[id], e)
		}
	}
	for k, n := range keys {
		if n > 1 {
			v.add("duplicate ledger idempotency key %s (%d entries)", k, n)
		}
	}
	for id, es := range prepaid {
		if len(es) > 1 {
			v.add("instance %s has %d prepaid charges", id, len(es))
		}
	}
	for id, es := range refunds {
		if len(es) > 1 {
			v.add("instance %s has %d refunds", id, len(es))
		}
	}
	// Every io.net instance that reached the provider has exactly its
	// prepaid charge; every one destroyed early its refund.
	for _, in := range s.instances {
		if in.billing != "prepaid" {
			continue
		}
		reached := in.providerID != "" && in.status != "pending" && in.status != "failed"
		es := prepaid[in.id]
		switch {
		case reached && len(es) == 0:
			v.add("lost prepaid charge: %s instance %s (%s) has no prepaid charge of %s", in.provider, in.id, in.status, usd(in.prepaid))
		case reached && es[0].amount != in.prepaid:
			v.add("prepaid charge of %s is %s, quoted total %s", in.id, usd(es[0].amount), usd(in.prepaid))
		case !reached && len(es) > 0 && len(refunds[in.id]) == 0:
			v.add("instance %s is %s without a provider deployment, yet charged %s prepaid", in.id, in.status, usd(es[0].amount))
		}
		if in.status == "terminated" && reached && in.hours > 1 {
			want := in.prepaid * int64(in.hours-1) / int64(in.hours)
			if ran := in.terminatedUS - max(in.startedUS, in.createdUS); ran >= hourUS {
				want = -1 // ran past the first hour: not expected in a short run, not checked
			}
			rs := refunds[in.id]
			switch {
			case want > 0 && len(rs) == 0:
				v.add("lost refund: %s instance %s (%dh, %s prepaid) destroyed early without a refund (want %s)",
					in.provider, in.id, in.hours, usd(in.prepaid), usd(want))
			case want > 0 && rs[0].amount != want:
				v.add("refund of %s is %s, io.net's rule gives %s", in.id, usd(rs[0].amount), usd(want))
			}
		}
	}
	// Meters: cumulative charges chain without gap or overlap, sum to what
	// the meter says, never past the stop, and one meter per instance.
	perInstance := map[string]int{}
	for _, m := range s.meters {
		perInstance[m.instanceID]++
		es := meterCharges[m.id]
		sort.Slice(es, func(i, j int) bool { return meterFrom(es[i]) < meterFrom(es[j]) })
		var sum int64
		cursor := m.startUS
		// A period whose cumulative charge rounds to nothing advances the
		// meter without a ledger entry: a gap is fine only when the
		// cumulative total at both ends is the same.
		cum := func(tUS int64) int64 { return cumulative(m.price, m.startUS, tUS) }
		// An interruptible instance's meter pauses while it is preempted
		// and resumes with its start moved on by the pause (db/preempt.go):
		// its chain has a gap per pause, and its charges before a pause
		// followed the start then. Its charges must still never overlap,
		// sum to what the meter says, and come to the cumulative rule at
		// the end (checked below): nothing charged for the paused time.
		paused := s.instances[m.instanceID] != nil && s.instances[m.instanceID].market == "interruptible"
		if paused && len(es) > 0 {
			cursor = min(cursor, meterFrom(es[0])) // its start moved on since
		}
		for _, e := range es {
			sum += e.amount
			switch from := meterFrom(e); {
			case from < cursor:
				v.add("meter %s (instance %s): charge %s covers from %d, but %d was already charged (overlap)",
					m.id, m.instanceID, e.key, from, cursor)
			case from > cursor && cum(from) != cum(cursor) && !paused:
				v.add("meter %s (instance %s): charge %s covers from %d, previous ended at %d: %s never charged",
					m.id, m.instanceID, e.key, from, cursor, usd(cum(from)-cum(cursor)))
			}
			if want := cum(e.atUS) - cum(meterFrom(e)); e.amount != want && !paused {
				v.add("meter charge %s is %s, the cumulative rule gives %s", e.key, usd(e.amount), usd(want))
			}
			cursor = e.atUS
		}
		// A charge that committed before a stop dated earlier: the stop
		// refunded the time past it and set the meter back to the stop.
		if r, ok := stopRefunds[m.id]; ok {
			if want := cum(cursor) - cum(m.stopUS); !m.stopped || cursor <= m.stopUS || r.amount != want {
				v.add("meter %s: stop refund %s, want %s for the time charged past its stop (%d, charged until %d)",
					m.id, usd(r.amount), usd(want), m.stopUS, cursor)
			}
			sum -= r.amount
			cursor = m.stopUS
		}
		if sum != m.chargedMicros {
			v.add("meter %s (instance %s): ledger charges %s, meter says %s", m.id, m.instanceID, usd(sum), usd(m.chargedMicros))
		}
		// A resume moves a paused meter's charged-until from its stop to
		// the resume with no ledger entry (nothing is owed for the pause,
		// db/preempt.go resumeMeter), and its start with it, so its
		// chain's end is checked by money only (above and below).
		if cursor != m.chargedUntilUS && cum(cursor) != cum(m.chargedUntilUS) && !paused {
			v.add("meter %s: ledger charged until %d, meter says %d", m.id, cursor, m.chargedUntilUS)
		}
		if want := cum(m.chargedUntilUS); want != m.chargedMicros {
			v.add("meter %s: charged %s until %d at %s/h, cumulative rule gives %s", m.id, usd(m.chargedMicros),
				m.chargedUntilUS, usd(m.price), usd(want))
		}
		if m.stopped && m.chargedUntilUS > m.stopUS {
			v.add("meter %s billed past its stop (%d > %d)", m.id, m.chargedUntilUS, m.stopUS)
		}
		if m.stopped && m.chargedUntilUS < m.stopUS {
			v.add("meter %s: stopped at %d but charged only until %d (final charge missing)", m.id, m.stopUS, m.chargedUntilUS)
		}
	}
	for id, n := range perInstance {
		if n > 1 {
			v.add("instance %s has %d meters", id, n)
		}
	}
	// Every running time-billed instance is billed; every terminated one's
	// meter is stopped.
	for _, in := range s.instances {
		if in.billing == "prepaid" || in.startedUS == 0 {
			continue
		}
		var open, any bool
		for _, m := range s.meters {
			if m.instanceID == in.id {
				any = true
				open = open || !m.stopped
			}
		}
		switch {
		case in.status == "running" && !open:
			v.add("unbilled: %s instance %s is running without an open meter", in.provider, in.id)
		case (in.status == "terminated" || in.status == "failed" || in.status == "stopped" || in.status == "preempted") && open:
			v.add("billed after stop: %s instance %s is %s with an open meter", in.provider, in.id, in.status)
		case in.status == "terminated" && !any:
			v.add("%s instance %s ran and was terminated without ever being metered", in.provider, in.id)
		}
	}
}

// cumulative is what a meter has charged in all from its start to t:
// price × whole milliseconds elapsed, rounded down (billing.Due).
func cumulative(price, startUS, tUS int64) int64 {
	ms := (tUS - startUS) / 1000
	return price*(ms/3_600_000) + price*(ms%3_600_000)/3_600_000
}

func meterFrom(e ledgerRow) int64 {
	parts := strings.Split(e.key, ":")
	n, _ := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	return n
}
