package ionet

import (
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

var _ providers.Refunder = (*Adapter)(nil)

// Refund applies io.net's early-destroy refund rule (see the package-level
// Refund function).
func (a *Adapter) Refund(total gpuproxy.Micros, hours int, started, destroyed time.Time) gpuproxy.Micros {
	return Refund(total, hours, started, destroyed)
}
