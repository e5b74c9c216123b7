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
	fmt.Fprintf(&s, `<svg class="%s" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		chartClass, chartW, chartH, html.EscapeString(title))
	fmt.Fprintf(&s, `<title>%s</title>`, html.EscapeString(title))
	for v := bottom; v <= top; v += step {
		yy := y(v)
		cls := "grid"
		if v == 0 {
			cls = "axis"
		}
		fmt.Fprintf(&s, `<line class="%s" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, cls, padL, chartW-padR, yy, yy)
		fmt.Fprintf(&s, `<text class="ylabel" x="%d" y="%.1f">%s</text>`, padL-6, yy+4, html.EscapeString(usdShort(v)))
	}
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
