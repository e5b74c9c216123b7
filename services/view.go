package services

import (
	"context"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
)

// View is a service as REST, MCP and the console show it: its definition
// (defaults filled), where it stands and how to call it.
type View struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Definition
	// BaseURL is the path OpenAI SDKs take as their base URL (prefix it
	// with gpuproxy's address).
	BaseURL string `json:"base_url"`
	Desired int    `json:"desired_replicas"`
	Ready   int    `json:"ready_replicas"`
	// Instances are the service's replicas not gone, oldest first
	// ("replicas" is the definition's bounds).
	Instances []ReplicaView `json:"instances"`
	Events    []EventView   `json:"events,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// ReplicaView is one replica of a service.
type ReplicaView struct {
	InstanceID string `json:"instance_id"`
	State      string `json:"state"`
	Instance   string `json:"instance_status,omitempty"`
	// Market is the market its instance was rented on: "on-demand" or
	// "interruptible".
	Market       string          `json:"market,omitempty"`
	Provider     string          `json:"provider,omitempty"`
	GPUName      string          `json:"gpu_name,omitempty"`
	PricePerHour gpuproxy.Micros `json:"price_per_hour"`
	ReadyAt      *time.Time      `json:"ready_at,omitempty"`
	Reason       string          `json:"reason,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
}

// EventView is one event of a service's history.
type EventView struct {
	Kind       string    `json:"kind"`
	InstanceID string    `json:"instance_id,omitempty"`
	Message    string    `json:"message"`
	At         time.Time `json:"at"`
}

// BaseURL is the OpenAI-compatible endpoint's path on gpuproxy.
const BaseURL = "/v1"

func (m *Manager) view(ctx context.Context, s gpuproxy.Service) (View, error) {
	v := View{ID: s.ID, State: string(s.State), Definition: DefinitionOf(s), BaseURL: BaseURL, Desired: s.Desired,
		Instances: []ReplicaView{}, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
	reps, err := m.store.Replicas(ctx, s.ID)
	if err != nil {
		return View{}, err
	}
	insts, err := m.store.ReplicaInstances(ctx, s.ID)
	if err != nil {
		return View{}, err
	}
	for _, r := range reps {
		rv := ReplicaView{InstanceID: r.InstanceID, State: string(r.State), Reason: r.Reason, CreatedAt: r.CreatedAt,
			Market: r.Market}
		if !r.ReadyAt.IsZero() {
			at := r.ReadyAt
			rv.ReadyAt = &at
		}
		if inst, ok := insts[r.InstanceID]; ok {
			rv.Instance, rv.Provider, rv.GPUName, rv.PricePerHour = string(inst.Status), inst.Provider, inst.GPUName, inst.PricePerHour
			if rv.Market == "" {
				rv.Market = inst.Market
			}
		}
		if r.State == gpuproxy.ReplicaReady {
			v.Ready++
		}
		v.Instances = append(v.Instances, rv)
	}
	return v, nil
}

func eventViews(evs []gpuproxy.ServiceEvent) []EventView {
	out := make([]EventView, 0, len(evs))
	for _, e := range evs {
		out = append(out, EventView{Kind: e.Kind, InstanceID: e.InstanceID, Message: e.Message, At: e.At})
	}
	return out
}

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}
