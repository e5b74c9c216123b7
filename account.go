package gpuproxy

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Scope is a permission carried by an API key or JWT.
type Scope string

// The scopes of DESIGN.md. ScopeAdmin implies every other scope.
const (
	ScopeOffersRead     Scope = "offers:read"
	ScopeInstancesRead  Scope = "instances:read"
	ScopeInstancesWrite Scope = "instances:write"
	ScopeSpendingRead   Scope = "spending:read"
	ScopeBillingRead    Scope = "billing:read"
	ScopeProxyInvoke    Scope = "proxy:invoke"
	ScopeAdmin          Scope = "admin"
)

// AllScopes lists every known scope.
var AllScopes = []Scope{ScopeOffersRead, ScopeInstancesRead, ScopeInstancesWrite,
	ScopeSpendingRead, ScopeBillingRead, ScopeProxyInvoke, ScopeAdmin}

// Presets are named scope sets for common roles.
var Presets = map[string][]Scope{
	"assistant": {ScopeOffersRead, ScopeInstancesRead, ScopeInstancesWrite, ScopeSpendingRead, ScopeBillingRead, ScopeProxyInvoke},
	"engineer":  {ScopeOffersRead, ScopeInstancesRead, ScopeInstancesWrite, ScopeSpendingRead, ScopeBillingRead, ScopeProxyInvoke},
	"finance":   {ScopeSpendingRead, ScopeBillingRead},
	"admin":     {ScopeAdmin},
}

// ParseScopes parses a comma- or space-separated scope list, refusing
// unknown scopes.
func ParseScopes(s string) ([]Scope, error) {
	var out []Scope
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		sc := Scope(f)
		if !slices.Contains(AllScopes, sc) {
			return nil, Invalid("scopes", "unknown scope %q", f)
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	if len(out) == 0 {
		return nil, Invalid("scopes", "at least one scope is required")
	}
	return out, nil
}

// JoinScopes renders scopes space-separated, as in a JWT scope claim.
func JoinScopes(scopes []Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, " ")
}

// Account owns keys, instances, ledger entries and limits.
type Account struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	OnExceed  string    `json:"on_exceed"`
	CreatedAt time.Time `json:"created_at"`
}

// On-exceed policies.
const (
	OnExceedBlock   = "block"
	OnExceedDestroy = "destroy"
)

// ValidateAccountName checks that name is a usable account name.
func ValidateAccountName(name string) error {
	if name == "" || len(name) > 64 {
		return Invalid("name", "must be 1 to 64 characters")
	}
	if name == "all" {
		return Invalid("name", `"all" is reserved: account=all means every account`)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return Invalid("name", "may contain only letters, digits, '-', '_' and '.'")
		}
	}
	return nil
}

// Principal is the authenticated caller of a request: an account and the
// scopes its credential grants.
type Principal struct {
	AccountID   int64
	AccountName string
	KeyID       string // API key id or JWT id, for rate limiting and logs
	Scopes      []Scope
}

// Has reports whether p holds scope s (admin holds every scope).
func (p Principal) Has(s Scope) bool {
	return slices.Contains(p.Scopes, s) || slices.Contains(p.Scopes, ScopeAdmin)
}

// Require returns a forbidden error unless p holds scope s.
func (p Principal) Require(s Scope) error {
	if p.Has(s) {
		return nil
	}
	return &Error{Code: EFORBIDDEN, Message: fmt.Sprintf("this key lacks the %s scope", s),
		Details: map[string]any{"required_scope": string(s)}}
}

// APIKey is a stored API key. The secret itself is never stored: only Hash,
// a SHA-256 of the full key, compared in constant time.
type APIKey struct {
	ID          string    `json:"id"`
	AccountID   int64     `json:"-"`
	AccountName string    `json:"account"`
	Name        string    `json:"name"`
	Hash        string    `json:"-"`
	Scopes      []Scope   `json:"scopes"`
	CreatedAt   time.Time `json:"created_at"`
	RevokedAt   time.Time `json:"revoked_at,omitzero"`
}
