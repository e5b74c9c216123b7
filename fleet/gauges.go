package fleet

import (
	"context"
	"fmt"

	"github.com/aiserve/gpuproxy"
)

// RunningByProvider counts the running instances of every account per
// provider (operator gauges). Each configured provider is present, with 0
// when none of its instances runs.
func (s *Service) RunningByProvider(ctx context.Context) (map[string]int, error) {
	insts, err := s.store.InstancesInStatus(ctx, gpuproxy.Running)
	if err != nil {
		return nil, fmt.Errorf("listing running instances: %w", err)
	}
	out := make(map[string]int, len(s.providers))
	for _, p := range s.providers {
		out[p.Name()] = 0
	}
	for _, in := range insts {
		out[in.Provider]++
	}
	return out, nil
}
