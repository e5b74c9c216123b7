package economics

import (
	"math"
	"math/big"

	"github.com/aiserve/gpuproxy"
)

// split divides amount over groups in proportion to their weights (each
// ≥ 0, at least one > 0): each share is amount × weight / total, rounded
// toward zero, and what rounding leaves goes to the largest weight (the
// first of equal ones), so the shares sum to amount exactly. Products are
// exact (big integers): no float ever touches money.
func split(amount gpuproxy.Micros, weights []int64) []gpuproxy.Micros {
	out := make([]gpuproxy.Micros, len(weights))
	var total int64
	largest := 0
	for i, w := range weights {
		total += w
		if w > weights[largest] {
			largest = i
		}
	}
	if total <= 0 {
		return out
	}
	a, t := big.NewInt(int64(amount)), big.NewInt(total)
	var rest = amount
	var p big.Int
	for i, w := range weights {
		p.Mul(a, big.NewInt(w))
		p.Quo(&p, t) // toward zero: |share| never exceeds its part
		out[i] = gpuproxy.Micros(p.Int64())
		rest -= out[i]
	}
	out[largest] += rest
	return out
}

// perMillion is cost per million tokens, rounded half away from zero
// (half up for a cost that is not negative); nil without tokens. A figure
// past the int64 range is clamped to it.
func perMillion(cost gpuproxy.Micros, tokens int64) *gpuproxy.Micros {
	if tokens <= 0 {
		return nil
	}
	n := new(big.Int).Mul(big.NewInt(int64(cost)), big.NewInt(1_000_000))
	d := big.NewInt(tokens)
	q, r := new(big.Int).QuoRem(n, d, new(big.Int))
	if r.Abs(r).Lsh(r, 1).Cmp(d) >= 0 { // 2·|r| ≥ tokens: half or more
		q.Add(q, big.NewInt(int64(n.Sign())))
	}
	var v gpuproxy.Micros
	switch {
	case q.IsInt64():
		v = gpuproxy.Micros(q.Int64())
	case q.Sign() > 0:
		v = math.MaxInt64
	default:
		v = math.MinInt64
	}
	return &v
}
