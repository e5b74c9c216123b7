package db

import (
	"context"
	"fmt"
	"time"
)

// OldestRunningMeter returns the charged_until of the running (not
// stopped) meter charged least far, for the metering lag gauge; ok is
// false when no meter runs. It reads the meters_due index.
func (s *Store) OldestRunningMeter(ctx context.Context) (time.Time, bool, error) {
	var until *int64
	if err := s.pool().queryRow(ctx,
		"SELECT min(charged_until_us) FROM meters WHERE stop_us IS NULL").Scan(&until); err != nil {
		return time.Time{}, false, fmt.Errorf("reading the oldest running meter: %w", translate(err))
	}
	if until == nil {
		return time.Time{}, false, nil
	}
	return fromUS(*until), true, nil
}
