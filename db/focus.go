package db

import (
	"context"
	"fmt"
)

// ReplicaService returns the name and model of the service that instance
// id of the account is (or was) a replica of, deleted services included;
// both are "" when it is no service's. The FOCUS export tags rows with
// them.
func (s *Store) ReplicaService(ctx context.Context, accountID int64, id string) (name, model string, err error) {
	r, err := s.pool().query(ctx, `SELECT s.name, s.model FROM service_replicas sr
		JOIN services s ON s.id = sr.service_id AND s.account_id = sr.account_id
		WHERE sr.account_id = $1 AND sr.instance_id = $2 ORDER BY sr.created_us DESC LIMIT 1`, accountID, id)
	type nm struct{ name, model string }
	got, err := scanAll(r, err, func(r rows) (nm, error) {
		var v nm
		return v, r.Scan(&v.name, &v.model)
	})
	if err != nil {
		return "", "", fmt.Errorf("reading an instance's service: %w", err)
	}
	if len(got) == 0 {
		return "", "", nil
	}
	return got[0].name, got[0].model, nil
}
