package ionet

import (
	"encoding/json"
	"testing"

	"github.com/aiserve/gpuproxy"
)

// io.net prices are binary floats rendered in full; they are rounded to the
// micro-dollar, not refused as caller input with 7+ places would be.
func TestUSDWireAmounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want gpuproxy.Micros
		set  bool
		ok   bool
	}{
		{`27.875342465753423`, 27_875_342, true, true},
		{`19.970000000000002`, 19_970_000, true, true},
		{`1e-05`, 10, true, true},
		{`0.6`, 600_000, true, true},
		{`"12.5"`, 12_500_000, true, true},
		{`0`, 0, true, true},
		{`null`, 0, false, true},
		{`"abc"`, 0, false, false},
		{`1e300`, 0, false, false},
	} {
		var u usd
		err := json.Unmarshal([]byte(tc.in), &u)
		if (err == nil) != tc.ok || u.v != tc.want || u.set != tc.set {
			t.Errorf("usd(%s) = %+v, %v; want %d set %v ok %v", tc.in, u, err, tc.want, tc.set, tc.ok)
		}
	}
}
