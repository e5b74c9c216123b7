package gpuproxy

import "time"

// OAuthClient is an OAuth client that registered itself (dynamic client
// registration): a remote MCP client such as a hosted assistant.
type OAuthClient struct {
	ID           string
	Name         string
	RedirectURIs []string
	// AuthMethod is how the client authenticates at the token endpoint:
	// "none" (a public client, PKCE only), "client_secret_post" or
	// "client_secret_basic".
	AuthMethod string
	// SecretHash is the hex SHA-256 of a confidential client's secret.
	SecretHash string
	CreatedAt  time.Time
}

// OAuthRequest is an authorization request between /oauth/authorize and
// the exchange of its code: a person approves it with an API key (KeyID,
// Granted), then it is given a code.
type OAuthRequest struct {
	ID            string
	ClientID      string
	RedirectURI   string
	State         string
	Nonce         string
	ResponseMode  string
	Scopes        []Scope // requested
	CodeChallenge string  // PKCE S256
	KeyID         string  // the approving key; empty until approved
	Granted       []Scope // what the person granted: at most the key's scopes
	CreatedAt     time.Time
	ExpiresAt     time.Time
	ApprovedAt    time.Time // zero until approved
}

// OAuthGrant is one client's connection approved by a key: the live
// refresh token of a grant.
type OAuthGrant struct {
	ID            string
	ClientID      string
	ClientName    string
	Scopes        []Scope
	ApprovedAt    time.Time
	LastRefreshed time.Time // when its current refresh token was issued
	ExpiresAt     time.Time // when that token expires unused
}

// OAuth token kinds.
const (
	OAuthAccess  = "access"
	OAuthRefresh = "refresh"
)

// OAuthToken is an issued access or refresh token, stored by the hash of
// its secret part. The tokens of one approval share GrantID.
type OAuthToken struct {
	Hash      string
	Kind      string // OAuthAccess or OAuthRefresh
	GrantID   string
	ClientID  string
	KeyID     string
	Scopes    []Scope
	CreatedAt time.Time
	ExpiresAt time.Time
	UsedAt    time.Time // a refresh token's one use; zero until used
	RevokedAt time.Time // zero unless revoked
}
