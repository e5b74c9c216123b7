package billing

import "github.com/aiserve/gpuproxy"

// Exposure is one on_exceed=destroy account's time-billed exposure as the
// database holds it: what the kill switch projects spend from.
type Exposure struct {
	AccountID int64
	// Meters are the account's unfinished meters: running (no stop), or
	// stopped and not yet charged up to their stop.
	Meters []Meter
	// Instances are the account's hourly instances that are pending,
	// starting, running or terminating.
	Instances []gpuproxy.Instance
	// Holds is the sum of the account's open holds that become spend
	// without a meter: proxy budget leases and prepaid creates (an hourly
	// create's hold is not spend; its instance counts at its price).
	Holds gpuproxy.Micros
}
