package economics

import (
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
)

// GroupNames lists the groupings for messages.
const GroupNames = "instance, model, key or service"

// DefaultPeriod is a query's period when it names neither end: the last
// seven days.
const DefaultPeriod = 7 * 24 * time.Hour

// MaxPeriod is the longest period a query may ask for.
const MaxPeriod = 366 * 24 * time.Hour

// MaxBuckets bounds the buckets of one series.
const MaxBuckets = 1000

// ValidGroup reports whether g is one of the four groupings.
func ValidGroup(g GroupBy) bool {
	switch g {
	case ByInstance, ByModel, ByKey, ByService:
		return true
	}
	return false
}

// WithDefaults returns q with its defaults filled in at now: without To,
// To is now; without From, From is DefaultPeriod before To; without
// GroupBy, ByInstance. Times are in UTC.
func (q Query) WithDefaults(now time.Time) Query {
	if q.To.IsZero() {
		q.To = now
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-DefaultPeriod)
	}
	if q.GroupBy == "" {
		q.GroupBy = ByInstance
	}
	q.From, q.To = q.From.UTC(), q.To.UTC()
	return q
}

// Validate reports the first field of q that a summary cannot use,
// naming it: the account, from and to are required (WithDefaults fills them), to must
// be after from and at most MaxPeriod after it, and group_by one of the
// four groupings.
func (q Query) Validate() error {
	switch {
	case q.AccountID <= 0:
		return gpuproxy.Invalid("account", "is required")
	case q.From.IsZero():
		return gpuproxy.Invalid("from", "is required")
	case q.To.IsZero():
		return gpuproxy.Invalid("to", "is required")
	case !q.To.After(q.From):
		return gpuproxy.Invalid("to", "must be after from")
	case q.To.Sub(q.From) > MaxPeriod:
		return gpuproxy.Invalid("to", "must be at most %d days after from (got %s days)", int(MaxPeriod/(24*time.Hour)),
			strconv.FormatFloat(q.To.Sub(q.From).Hours()/24, 'f', -1, 64))
	case !ValidGroup(q.GroupBy):
		return gpuproxy.Invalid("group_by", "must be %s", GroupNames)
	}
	return nil
}

// validBucket reports whether a series of q can have buckets of length
// bucket: at least a second, and at most MaxBuckets of them.
func (q Query) validBucket(bucket time.Duration) error {
	switch {
	case bucket < time.Second:
		return gpuproxy.Invalid("bucket", "must be at least 1s")
	case (q.To.Sub(q.From)+bucket-1)/bucket > MaxBuckets:
		least := (q.To.Sub(q.From) + MaxBuckets - 1) / MaxBuckets
		least = (least + time.Second - 1).Truncate(time.Second)
		return gpuproxy.Invalid("bucket", "must be at least %s for this period (at most %d buckets)", least, MaxBuckets)
	}
	return nil
}
