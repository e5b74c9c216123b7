package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/aiserve/gpuproxy"
)

// writeTable writes rows (the first is the header) as aligned columns.
// Cells are strings, integers or gpuproxy.Micros; the amounts of one
// column are printed at one precision: cents, or as many places (up to
// six) as its most precise amount needs, so that they line up and none is
// rounded.
func writeTable(w io.Writer, rows [][]any) error {
	places := map[int]int{}
	for _, r := range rows {
		for i, c := range r {
			if m, ok := c.(gpuproxy.Micros); ok {
				places[i] = max(places[i], 2, decimalPlaces(m))
			}
		}
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			if m, ok := c.(gpuproxy.Micros); ok {
				cells[i] = usdAt(m, places[i])
			} else {
				cells[i] = fmt.Sprint(c)
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// decimalPlaces is the number of decimal places m needs (0 to 6).
func decimalPlaces(m gpuproxy.Micros) int {
	_, frac, _ := strings.Cut(m.String(), ".")
	return len(frac)
}

// usdAt renders m as dollars with exactly places decimal places (places
// at least decimalPlaces(m)): "$12.50", "-$0.000125".
func usdAt(m gpuproxy.Micros, places int) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	whole, frac, _ := strings.Cut(m.String(), ".")
	if places > 0 {
		whole += "." + frac + strings.Repeat("0", places-len(frac))
	}
	return sign + "$" + whole
}

// usd renders m alone at cents or more places: "$5.00", "$0.125".
func usd(m gpuproxy.Micros) string { return usdAt(m, max(2, decimalPlaces(m))) }
