package gpuproxy

import "time"

// InstanceStatus is an instance's lifecycle state.
type InstanceStatus string

// Lifecycle: pending → starting → running → terminating → terminated, or failed.
const (
	Pending     InstanceStatus = "pending"
	Starting    InstanceStatus = "starting"
	Running     InstanceStatus = "running"
	Terminating InstanceStatus = "terminating"
	Terminated  InstanceStatus = "terminated"
	Failed      InstanceStatus = "failed"
)

// Instance is our record of one rented instance.
type Instance struct {
	ID                 string // ours, e.g. "gpi_3f2a…"; the provider tag
	AccountID          int64
	Provider           string
	ProviderInstanceID string
	OfferID            string
	GPUName            string
	NumGPUs            int
	PricePerHour       Micros
	Billing            string // "hourly" | "prepaid"
	Hours              int    // prepaid duration
	PrepaidTotal       Micros
	Image              string
	Label              string
	Status             InstanceStatus
	Endpoint           string
	IdempotencyKey     string
	HoldID             int64
	KeyID              string // the API key whose principal created it; its spend counts against the key's windows
	Error              string
	CreatedAt          time.Time
	StartedAt          time.Time // provider reported running (metering starts)
	TerminatedAt       time.Time
	UpdatedAt          time.Time
}
