package db

import "context"

// AdmitCacheForTest returns the clock of the account's Postgres admission
// cache (cache_at_us) and whether the cache is current (cache_version =
// spend_version). gp_admit's exact path sets the clock to the admission's
// now; its fast path leaves it, so a hold admitted with the clock still
// earlier than its now came through the fast path. SQLite has no cache:
// 0, false.
func (s *Store) AdmitCacheForTest(ctx context.Context, accountID int64) (at int64, current bool, err error) {
	if s.pg == nil {
		return 0, false, nil
	}
	err = s.pool().queryRow(ctx,
		"SELECT cache_at_us, cache_version = spend_version FROM accounts WHERE id = $1", accountID).Scan(&at, &current)
	return at, current, translate(err)
}
