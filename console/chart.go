package console

import (
	"fmt"
	"html"
	"html/template"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// bucket is one bar of the spend chart.
type bucket struct {
	Start time.Time
	Label string          // x-axis label ("" to skip)
	Title string          // the bar's tooltip heading (its time span)
	Spend gpuproxy.Micros // charges − refunds + adjustments
}

// Chart geometry, in SVG user units; the SVG scales to its container.
const (
	chartW, chartH     = 720, 240
	padL, padR         = 64, 8
	padTop, padBottom  = 12, 28
	plotW, plotH       = chartW - padL - padR, chartH - padTop - padBottom
	barGapRatio        = 0.2
	maxTicks           = 5
	minTickMicros      = 10_000 // $0.01
	chartClass, barCls = "chart", "b"
)

// spendChart draws buckets as an SVG bar chart with a dollar axis. It is
// built as text here, with every label escaped, so the page needs no
// script and no chart library.
func spendChart(title string, bs []bucket) template.HTML {
	lo, hi := gpuproxy.Micros(0), gpuproxy.Micros(0)
	for _, b := range bs {
		lo, hi = min(lo, b.Spend), max(hi, b.Spend)
	}
	step := tickStep(hi - lo)
	// Round the axis out to whole ticks.
	top := ceilTo(hi, step)
	bottom := -ceilTo(-lo, step)
	if top == bottom {
		top = bottom + step
	}
	y := func(m gpuproxy.Micros) float64 {
		return padTop + float64(plotH)*float64(top-m)/float64(top-bottom)
	}
	var s strings.Builder
	chartHead(&s, title, bottom, top, step, y)
	if n := len(bs); n > 0 {
		slot := float64(plotW) / float64(n)
		w := slot * (1 - barGapRatio)
		for i, b := range bs {
			x := padL + slot*float64(i) + (slot-w)/2
			y0, y1 := y(max(b.Spend, 0)), y(min(b.Spend, 0))
			cls := barCls
			if b.Spend < 0 {
				cls += " neg"
			}
			fmt.Fprintf(&s, `<rect class="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-spend="%d"><title>%s: %s</title></rect>`,
				cls, x, y0, w, max(y1-y0, 0), int64(b.Spend), html.EscapeString(b.Title), html.EscapeString(usd(b.Spend)))
			if b.Label != "" {
				fmt.Fprintf(&s, `<text class="xlabel" x="%.1f" y="%d">%s</text>`, x+w/2, chartH-8, html.EscapeString(b.Label))
			}
		}
	}
	s.WriteString(`</svg>`)
	return template.HTML(s.String()) // #nosec: built above with every text escaped
}

// chartHead opens a chart's SVG: its title, then a grid line and a dollar
// label per step from bottom to top (the zero line as the axis).
func chartHead(s *strings.Builder, title string, bottom, top, step gpuproxy.Micros, y func(gpuproxy.Micros) float64) {
	fmt.Fprintf(s, `<svg class="%s" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		chartClass, chartW, chartH, html.EscapeString(title))
	fmt.Fprintf(s, `<title>%s</title>`, html.EscapeString(title))
	for v := bottom; v <= top; v += step {
		yy := y(v)
		cls := "grid"
		if v == 0 {
			cls = "axis"
		}
		fmt.Fprintf(s, `<line class="%s" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, cls, padL, chartW-padR, yy, yy)
		fmt.Fprintf(s, `<text class="ylabel" x="%d" y="%.1f">%s</text>`, padL-6, yy+4, html.EscapeString(usdShort(v)))
	}
}

// chartSlot is one x position of a line chart: a bucket of time.
type chartSlot struct {
	Label string // x-axis label ("" to skip)
	Title string // its time span, in the points' tooltips
}

// chartLine is one series of a line chart: a value per slot, nil where it
// has none (the line breaks there). Class colours it (lineClass).
type chartLine struct {
	Name   string
	Class  string
	Values []*gpuproxy.Micros
}

// lineColors is how many colours the line chart's series cycle through
// (classes s0 … s7 in the stylesheet).
const lineColors = 8

// lineClass is the colour class of the i-th series.
func lineClass(i int) string { return fmt.Sprintf("s%d", i%lineColors) }

// pointRadius is a line chart's point, in SVG user units.
const pointRadius = 3.5

// lineChart draws lines over slots as an SVG line chart with a dollar
// axis: each series a polyline through its consecutive values and a
// point per value, whose tooltip says the series, the slot's span and the
// amount followed by unit ("per 1M output tokens"). Like spendChart it is
// text built here with every label escaped.
func lineChart(title, unit string, slots []chartSlot, lines []chartLine) template.HTML {
	lo, hi := gpuproxy.Micros(0), gpuproxy.Micros(0)
	for _, l := range lines {
		for _, v := range l.Values {
			if v != nil {
				lo, hi = min(lo, *v), max(hi, *v)
			}
		}
	}
	step := tickStep(hi - lo)
	top := ceilTo(hi, step)
	bottom := -ceilTo(-lo, step)
	if top == bottom {
		top = bottom + step
	}
	y := func(m gpuproxy.Micros) float64 {
		return padTop + float64(plotH)*float64(top-m)/float64(top-bottom)
	}
	var s strings.Builder
	chartHead(&s, title, bottom, top, step, y)
	slot := float64(plotW) / float64(max(len(slots), 1))
	x := func(i int) float64 { return padL + slot*(float64(i)+0.5) }
	for i, sl := range slots {
		if sl.Label != "" {
			fmt.Fprintf(&s, `<text class="xlabel" x="%.1f" y="%d">%s</text>`, x(i), chartH-8, html.EscapeString(sl.Label))
		}
	}
	for _, l := range lines {
		fmt.Fprintf(&s, `<g class="series %s" data-series="%s">`, l.Class, html.EscapeString(l.Name))
		// A polyline per run of consecutive values; a gap breaks it.
		var run []string
		flush := func() {
			if len(run) > 1 {
				fmt.Fprintf(&s, `<polyline class="line" points="%s"/>`, strings.Join(run, " "))
			}
			run = run[:0]
		}
		for i, v := range l.Values {
			if v == nil {
				flush()
				continue
			}
			run = append(run, fmt.Sprintf("%.1f,%.1f", x(i), y(*v)))
		}
		flush()
		for i, v := range l.Values {
			if v == nil || i >= len(slots) {
				continue
			}
			fmt.Fprintf(&s, `<circle class="pt" cx="%.1f" cy="%.1f" r="%g" data-micros="%d"><title>%s, %s: %s %s</title></circle>`,
				x(i), y(*v), pointRadius, int64(*v), html.EscapeString(l.Name), html.EscapeString(slots[i].Title),
				html.EscapeString(usd(*v)), html.EscapeString(unit))
		}
		s.WriteString(`</g>`)
	}
	s.WriteString(`</svg>`)
	return template.HTML(s.String()) // #nosec: built above with every text escaped
}

// tickStep picks a round step (1, 2 or 5 × 10^k micro-dollars, at least a
// cent) that divides span into at most maxTicks intervals.
func tickStep(span gpuproxy.Micros) gpuproxy.Micros {
	step := gpuproxy.Micros(minTickMicros)
	for {
		for _, f := range []gpuproxy.Micros{1, 2, 5} {
			if span <= step*f*maxTicks {
				return step * f
			}
		}
		step *= 10
	}
}

func ceilTo(m, step gpuproxy.Micros) gpuproxy.Micros {
	if m <= 0 {
		return 0
	}
	return (m + step - 1) / step * step
}

// usdShort is an axis label: whole dollars when the value is whole, cents
// otherwise, thousands as "k".
func usdShort(m gpuproxy.Micros) string {
	neg := m < 0
	if neg {
		m = -m
	}
	var s string
	switch {
	case m >= 1000*gpuproxy.MicrosPerUSD && m%(100*gpuproxy.MicrosPerUSD) == 0:
		s = fmt.Sprintf("$%gk", float64(m/(100*gpuproxy.MicrosPerUSD))/10)
	case m%gpuproxy.MicrosPerUSD == 0:
		s = fmt.Sprintf("$%d", m/gpuproxy.MicrosPerUSD)
	default:
		s = usd(m - m%10_000)
	}
	if neg {
		s = "-" + s
	}
	return s
}

// windowBar draws one window as a stacked bar against its limit: spent,
// held and committed, scaled to the limit (or to the total, with the limit
// marked, once it is passed). level colours it: ok, warn (80% or more) or
// over (100% or more).
func windowBar(limit, spent, held, committed gpuproxy.Micros) (template.HTML, string, int) {
	used := max(spent, 0) + max(held, 0) + max(committed, 0)
	scale := max(limit, used, 1)
	pct := 0
	if limit > 0 {
		pct = int(min(used*100/limit, 999))
	} else if used > 0 {
		pct = 999
	}
	level := "ok"
	switch {
	case pct >= 100:
		level = "over"
	case pct >= 80:
		level = "warn"
	}
	var s strings.Builder
	fmt.Fprintf(&s, `<svg class="bar %s" viewBox="0 0 1000 20" preserveAspectRatio="none" role="img" aria-label="%d%% of the limit" xmlns="http://www.w3.org/2000/svg">`, level, pct)
	s.WriteString(`<rect class="track" x="0" y="0" width="1000" height="20"/>`)
	x := 0.0
	for _, seg := range []struct {
		cls string
		v   gpuproxy.Micros
	}{{"spent", spent}, {"held", held}, {"committed", committed}} {
		if seg.v <= 0 {
			continue
		}
		w := 1000 * float64(seg.v) / float64(scale)
		fmt.Fprintf(&s, `<rect class="%s" x="%.2f" y="0" width="%.2f" height="20"/>`, seg.cls, x, w)
		x += w
	}
	if used > limit && limit > 0 {
		lx := 1000 * float64(limit) / float64(scale)
		fmt.Fprintf(&s, `<rect class="limit" x="%.2f" y="0" width="4" height="20"/>`, lx-2)
	}
	s.WriteString(`</svg>`)
	return template.HTML(s.String()), level, pct // #nosec: no caller text
}
