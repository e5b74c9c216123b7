package main

import "testing"

// TestOrphanPolicyConfig: fleet.orphan_policy takes destroy and leave, and
// still adopt (the deprecated name of leave); anything else is refused
// with the value given.
func TestOrphanPolicyConfig(t *testing.T) {
	for _, p := range []string{"destroy", "leave", "adopt"} {
		if _, err := loadConfig("", envFunc(map[string]string{"GPUPROXY_ORPHAN_POLICY": p})); err != nil {
			t.Errorf("orphan_policy %s: %v", p, err)
		}
	}
	_, err := loadConfig("", envFunc(map[string]string{"GPUPROXY_ORPHAN_POLICY": "keep"}))
	if want := `GPUPROXY_ORPHAN_POLICY: must be destroy or leave, got "keep"`; err == nil || err.Error() != want {
		t.Errorf("orphan_policy keep: %v, want %q", err, want)
	}
}
