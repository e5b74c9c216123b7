package fleet

import "time"

// ObserveKillSwitchLagForTest records a kill switch pass that was ready to
// act d after it was scheduled.
func (s *Service) ObserveKillSwitchLagForTest(d time.Duration) { s.passLag.observe(d) }
