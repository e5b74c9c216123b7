package economics

import "time"

// island is one run of overlapping spans, [lo, hi] in microseconds.
type island struct{ lo, hi int64 }

// union measures a union of intervals fed in order of their start: each
// one either extends the current island or closes it and starts another.
type union struct {
	cur   island
	open  bool
	total int64 // microseconds of the closed islands
}

// add takes [lo, hi]; lo must not be before the last lo added.
func (u *union) add(lo, hi int64) {
	switch {
	case !u.open:
		u.cur, u.open = island{lo, hi}, true
	case lo > u.cur.hi:
		u.total += u.cur.hi - u.cur.lo
		u.cur = island{lo, hi}
	case hi > u.cur.hi:
		u.cur.hi = hi
	}
}

// measure closes the current island and returns the union's length.
func (u *union) measure() int64 {
	if u.open {
		u.total += u.cur.hi - u.cur.lo
		u.open = false
	}
	return u.total
}

// busyMeter sums, per group and over every group, the time with a
// request in flight on each instance, walking spans ordered by instance
// then start (EachUsageSpan's order). Each span is clipped to clip's
// window for its instance (the period ∩ the instance's running time)
// before it joins its instance's unions; an instance's unions are
// measured when the next instance starts, and by done.
type busyMeter struct {
	clip    func(instanceID string) (lo, hi int64, ok bool)
	group   func(Span) string
	inst    string
	seen    bool // an instance is current
	lo, hi  int64
	running bool // the current instance ran in the period
	groups  map[string]*union
	all     union
	// Busy per group and in all, in microseconds.
	Busy  map[string]int64
	Total int64
}

func newBusyMeter(clip func(string) (int64, int64, bool), group func(Span) string) *busyMeter {
	return &busyMeter{clip: clip, group: group, groups: map[string]*union{}, Busy: map[string]int64{}}
}

// add takes the next span.
func (b *busyMeter) add(sp Span) error {
	if !b.seen || sp.InstanceID != b.inst {
		b.flush()
		b.inst, b.seen = sp.InstanceID, true
		b.lo, b.hi, b.running = b.clip(sp.InstanceID)
	}
	if !b.running {
		return nil
	}
	at := sp.At.UnixMicro()
	lo, hi := max(at, b.lo), min(at+max(sp.Latency, 0).Microseconds(), b.hi)
	if hi <= lo {
		return nil // not in flight while the instance ran in the period
	}
	g := b.group(sp)
	u := b.groups[g]
	if u == nil {
		u = &union{}
		b.groups[g] = u
	}
	u.add(lo, hi)
	b.all.add(lo, hi)
	return nil
}

// flush measures the current instance's unions.
func (b *busyMeter) flush() {
	for g, u := range b.groups {
		b.Busy[g] += u.measure()
	}
	b.groups = map[string]*union{}
	b.Total += b.all.measure()
	b.all = union{}
}

// done measures the last instance.
func (b *busyMeter) done() { b.flush() }

// micros is a duration of v microseconds.
func micros(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
