package ionet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// This file holds io.net's wire types. Every GET reply wraps its payload in
// {"data": ...}; deploy and delete replies are bare {"status","deployment_id"}.

// envelope is the {"data": ...} wrapper of GET replies.
type envelope[T any] struct {
	Data T `json:"data"`
}

// hardwareID is a hardware id that io.net sends as an integer (CaaS, 203) or
// a string (catalog, "8H100.80S.176V"). It is sent back the way it came.
type hardwareID string

// UnmarshalJSON accepts a JSON number or string.
func (h *hardwareID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*h = hardwareID(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("hardware id: %w", err)
	}
	*h = hardwareID(n.String())
	return nil
}

// MarshalJSON sends an all-digit id as a JSON integer, anything else as a
// string.
func (h hardwareID) MarshalJSON() ([]byte, error) {
	if isDigits(string(h)) {
		return []byte(h), nil
	}
	return json.Marshal(string(h))
}

// usd is a dollar amount io.net sends as a JSON number; a numeric string is
// tolerated and null (or absence) leaves it unset.
type usd struct {
	v   gpuproxy.Micros
	set bool
}

// UnmarshalJSON parses the amount exactly, rounded half away from zero to
// the micro-dollar: io.net sends binary floats such as 27.875342465753423.
func (u *usd) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		*u = usd{}
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	v, err := gpuproxy.RoundUSD(s)
	if err != nil {
		return fmt.Errorf("amount %q: %w", s, err)
	}
	*u = usd{v: v, set: true}
	return nil
}

// wireHardware is an item of caas/hardware/max-gpus-per-container.
type wireHardware struct {
	HardwareID          hardwareID `json:"hardware_id"`
	HardwareName        string     `json:"hardware_name"`
	BrandName           string     `json:"brand_name"`
	MaxGPUsPerContainer int        `json:"max_gpus_per_container"`
	Available           int        `json:"available"`
	Price               usd        `json:"price"` // USD per GPU-hour (unit unverified)
}

// name returns the hardware name, with new-api's fallback for empty names.
func (h wireHardware) name() string {
	if h.HardwareName != "" {
		return h.HardwareName
	}
	return "Hardware " + string(h.HardwareID)
}

// displayName is the name offers and instances show: brand and model
// ("NVIDIA A100-SXM4-80GB").
func (h wireHardware) displayName() string {
	return strings.TrimSpace(h.BrandName + " " + h.name())
}

type wireHardwareList struct {
	Hardware []wireHardware `json:"hardware"`
	Total    int            `json:"total"`
}

// wireLocation is an item of caas/available-replicas.
type wireLocation struct {
	ID                int    `json:"id"`
	ISO2              string `json:"iso2"`
	Name              string `json:"name"`
	AvailableReplicas int    `json:"available_replicas"`
}

// label renders a location like other providers do ("Finland, FI").
func (l wireLocation) label() string {
	switch {
	case l.Name != "" && l.ISO2 != "":
		return l.Name + ", " + l.ISO2
	case l.ISO2 != "":
		return l.ISO2
	case l.Name != "":
		return l.Name
	}
	return fmt.Sprintf("location %d", l.ID)
}

// wirePrice is the payload of caas/price.
type wirePrice struct {
	ReplicaCount          int   `json:"replica_count"`
	GPUsPerContainer      int   `json:"gpus_per_container"`
	AvailableReplicaCount []int `json:"available_replica_count"`
	TotalCostUSDC         usd   `json:"total_cost_usdc"`
}

// deployRequest is the CaaS deploy body. The server forbids unknown keys.
type deployRequest struct {
	ResourcePrivateName string          `json:"resource_private_name"`
	DurationHours       int             `json:"duration_hours"`
	GPUsPerContainer    int             `json:"gpus_per_container"`
	HardwareID          hardwareID      `json:"hardware_id"`
	LocationIDs         []int           `json:"location_ids"`
	ContainerConfig     containerConfig `json:"container_config"`
	RegistryConfig      registryConfig  `json:"registry_config"`
}

type containerConfig struct {
	ReplicaCount       int               `json:"replica_count"`
	TrafficPort        int               `json:"traffic_port"`
	EnvVariables       map[string]string `json:"env_variables,omitempty"`
	SecretEnvVariables map[string]string `json:"secret_env_variables,omitempty"`
	Args               []string          `json:"args,omitempty"`
}

type registryConfig struct {
	ImageURL string  `json:"image_url"`
	Username *string `json:"registry_username,omitempty"`
	Secret   *string `json:"registry_secret,omitempty"`
}

// actionReply is the bare reply of deploy and delete.
type actionReply struct {
	Status       string `json:"status"`
	DeploymentID string `json:"deployment_id"`
}

// wireDeployment is a deployment as details (caas/deployment/{id}) and list
// items (caas/deployments) report it; each carries a subset of the fields.
type wireDeployment struct {
	ID                      string   `json:"id"`
	Status                  string   `json:"status"`
	Name                    string   `json:"name"`                  // list items
	ResourcePrivateName     string   `json:"resource_private_name"` // tolerated if present
	CreatedAt               wireTime `json:"created_at"`
	StartedAt               wireTime `json:"started_at"`
	FinishedAt              wireTime `json:"finished_at"`
	AmountPaid              usd      `json:"amount_paid"`
	TotalGPUs               int      `json:"total_gpus"`
	GPUsPerContainer        int      `json:"gpus_per_container"`
	TotalContainers         int      `json:"total_containers"`
	HardwareQuantity        int      `json:"hardware_quantity"`
	HardwareName            string   `json:"hardware_name"`
	BrandName               string   `json:"brand_name"`
	ComputeMinutesServed    float64  `json:"compute_minutes_served"`
	ComputeMinutesRemaining float64  `json:"compute_minutes_remaining"`
}

type wireDeploymentList struct {
	Deployments []wireDeployment `json:"deployments"`
	Total       int              `json:"total"`
}

// wireWorker is an item of caas/deployment/{id}/containers.
type wireWorker struct {
	ContainerID string  `json:"container_id"`
	Status      string  `json:"status"`
	PublicURL   *string `json:"public_url"`
}

type wireWorkerList struct {
	Workers []wireWorker `json:"workers"`
	Total   int          `json:"total"`
}

// wireTime is a tolerant timestamp: io.net sends RFC 3339, but also
// zone-less forms ("2024-01-01T00:00:00", "...T12:00:00.123456",
// "2023-09-11 05:04:53"), which are UTC. null and "" are the zero time.
type wireTime struct{ time.Time }

var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05.999999999Z0700",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02",
}

// UnmarshalJSON parses any of timeLayouts; zone-less values are UTC.
func (t *wireTime) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timestamp: %w", err)
	}
	v, err := parseTime(s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// parseTime parses an io.net timestamp, assuming UTC when it has no zone.
func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, l := range timeLayouts {
		if v, err := time.Parse(l, s); err == nil {
			return v.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("unrecognised timestamp %q", s)
}

// normalizeEndpoint turns a public_url into scheme://host[:port][/path]
// without a trailing slash. A bare host gets https://. Query and fragment
// are dropped. It returns "" for an empty or unusable value.
func normalizeEndpoint(raw string) string {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return ""
	}
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	u.Host = strings.TrimSuffix(u.Host, ":")
	return u.Scheme + "://" + strings.ToLower(u.Host) + strings.TrimRight(u.EscapedPath(), "/")
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
