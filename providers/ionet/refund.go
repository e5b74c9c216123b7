package ionet

import (
	"math/bits"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Refund returns what io.net refunds, as IO Credits (1 credit = 1 USD), when
// a deployment prepaid for hours hours at total is destroyed early.
//
// io.net's rule (docs, "destroy deployment"): the first hour is
// non-refundable; after it, the unused prepaid time is refunded pro rata,
// computed on the exact runtime rather than on whole hours. So with
// runtime = destroyed − started, charged time = max(runtime, 1h) and
// refund = total × (hours·1h − charged) / (hours·1h), rounded down to the
// micro-dollar, and zero once the charged time reaches the prepaid hours.
// A destroy before the start (or a zero runtime) still keeps the first hour.
// total is the whole prepaid amount (all GPUs and replicas) for hours; after
// an extension pass the summed amount and hours.
func Refund(total gpuproxy.Micros, hours int, started, destroyed time.Time) gpuproxy.Micros {
	if total <= 0 || hours <= 0 {
		return 0
	}
	paid := time.Duration(hours) * time.Hour
	if hours > int(maxHours) {
		paid = maxHours * time.Hour
	}
	charged := max(destroyed.Sub(started), time.Hour)
	if charged >= paid {
		return 0
	}
	// total × unused / paid in 128 bits: the product can exceed int64 for
	// large totals, the quotient cannot (unused < paid).
	hi, lo := bits.Mul64(uint64(total), uint64(paid-charged))
	q, _ := bits.Div64(hi, lo, uint64(paid))
	return gpuproxy.Micros(q)
}

// maxHours caps durations so time.Duration cannot overflow (about 29 years,
// well beyond io.net's 8760-hour limit per deploy).
const maxHours = 250_000
