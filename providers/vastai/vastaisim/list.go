package vastaisim

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// queryJSON reads a query parameter that clients JSON-encode; plain
// strings are accepted too.
func queryJSON(r *http.Request, name string) (any, bool) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return nil, false
	}
	var v any
	if json.Unmarshal([]byte(raw), &v) != nil {
		return raw, true
	}
	return v, true
}

// vast.ai's v1 instance list pages: limit defaults to and is capped at
// listPageMax; a limit of 0 or less gives listPageOfNone.
const (
	listPageMax    = 25
	listPageOfNone = 5
)

// listInstancesV1 answers GET /api/v1/instances/: pages of at most
// listPageMax in id order, with next_token/after_token.
func (s *Server) listInstancesV1(w http.ResponseWriter, r *http.Request, _ []byte, _ int64) {
	limit := listPageMax
	if v, ok := queryJSON(r, "limit"); ok {
		switch n, _ := v.(float64); {
		case n <= 0:
			limit = listPageOfNone
		case n < listPageMax:
			limit = int(n)
		}
	}
	after := int64(0)
	if v, ok := queryJSON(r, "after_token"); ok {
		tok, _ := v.(string)
		n, err := strconv.ParseInt(strings.TrimPrefix(tok, "tok_"), 36, 64)
		if !strings.HasPrefix(tok, "tok_") || err != nil {
			writeError(w, http.StatusBadRequest, "invalid_token", "Invalid pagination token")
			return
		}
		after = n
	}
	var fs []filter
	if v, ok := queryJSON(r, "select_filters"); ok {
		q, isObj := v.(map[string]any)
		if !isObj {
			writeError(w, http.StatusBadRequest, "invalid_request", "select_filters must be a JSON object")
			return
		}
		var err error
		fs, err = parseFilters(q, func(f string) bool { return f != "dph_total" && f != "num_gpus" }, nil)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error()+" (computed fields cannot be filtered)")
			return
		}
	}
	s.mu.Lock()
	ids := make([]int64, 0, len(s.instances))
	for id, in := range s.instances {
		if !in.destroyed {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var all []map[string]any
	for _, id := range ids {
		if row := s.instanceJSON(s.instances[id]); matches(toRow(row), fs) {
			all = append(all, row)
		}
	}
	s.mu.Unlock()
	counts := map[string]int{}
	var page []map[string]any
	more := false
	for _, row := range all {
		l, _ := row["label"].(string)
		counts[l]++
		if row["id"].(int64) <= after {
			continue
		}
		if len(page) == limit {
			more = true
			continue
		}
		page = append(page, row)
	}
	var next any
	if more {
		next = "tok_" + strconv.FormatInt(page[len(page)-1]["id"].(int64), 36)
	}
	if page == nil {
		page = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "instances_found": len(page),
		"total_instances": len(all), "label_counts": counts, "next_token": next, "instances": page})
}

// listInstancesV0 answers the deprecated GET /api/v0/instances/.
func (s *Server) listInstancesV0(w http.ResponseWriter, _ *http.Request, _ []byte, _ int64) {
	s.mu.Lock()
	rows := []map[string]any{}
	for _, in := range s.sortedInstances() {
		if !in.destroyed {
			rows = append(rows, s.instanceJSON(in))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"instances_found": len(rows), "instances": rows})
}
