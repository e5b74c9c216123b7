// Package auth authenticates callers — API keys (random, shown once, stored
// as a SHA-256 hash, compared in constant time) and HS256 JWTs — into a
// gpuproxy.Principal with scopes, manages accounts and keys, and rate-limits
// per key.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/aiserve/gpuproxy"
)

// Store is what auth needs from the database.
type Store interface {
	CreateAccount(ctx context.Context, name string, now time.Time) (gpuproxy.Account, error)
	AccountByName(ctx context.Context, name string) (gpuproxy.Account, error)
	ListAccounts(ctx context.Context) ([]gpuproxy.Account, error)
	CreateKey(ctx context.Context, k gpuproxy.APIKey) error
	KeyByID(ctx context.Context, id string) (gpuproxy.APIKey, error)
	ListKeys(ctx context.Context, accountID int64) ([]gpuproxy.APIKey, error)
	RevokeKey(ctx context.Context, accountID int64, id string, now time.Time) error
	// SetKeyConfirmAbove sets (nil: removes) the cost above which the key's
	// creates need a person's confirmation.
	SetKeyConfirmAbove(ctx context.Context, accountID int64, keyID string, above *gpuproxy.Micros) error
	KeyConfirmAbove(ctx context.Context, keyID string) (gpuproxy.Micros, bool, error)
	KeyConfirmThresholds(ctx context.Context, accountID int64) (map[string]gpuproxy.Micros, error)
}

// DefaultCacheTTL is how long a verified key or JWT account stays cached
// by default: revocation takes effect within it.
const DefaultCacheTTL = 5 * time.Second

// Options configure a Service. Zero values take the defaults; every value
// is usable (a negative CacheTTL disables the cache), so there is nothing
// to validate.
type Options struct {
	// JWTSecret enables HS256 JWTs as bearer tokens when not empty.
	JWTSecret []byte
	// CacheTTL is how long a verified key or JWT account stays cached
	// (default DefaultCacheTTL; revocation takes effect within it).
	// Negative disables.
	CacheTTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Tokens, when set, checks OAuth access tokens (the oauth package): a
	// token acts for the key that approved its client, with at most that
	// key's scopes.
	Tokens TokenVerifier
}

// TokenVerifier checks an OAuth access token and returns the id of the
// API key it acts for and the scopes granted to it. Every failure of the
// token itself is the unauthorized error.
type TokenVerifier interface {
	VerifyAccessToken(ctx context.Context, token string) (keyID string, scopes []gpuproxy.Scope, err error)
}

// Service manages accounts and keys and authenticates requests.
type Service struct {
	store Store
	opts  Options
	cache sync.Map // key id or "jwt:"+account → cached
}

type cached struct {
	key     gpuproxy.APIKey
	digest  [sha256.Size]byte // key.Hash decoded, compared with each credential's
	account gpuproxy.Account
	until   time.Time
}

// New returns a Service.
func New(store Store, o Options) *Service {
	return &Service{store: store, opts: o.withDefaults()}
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.CacheTTL == 0 {
		o.CacheTTL = DefaultCacheTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// KeyPrefix starts every API key, so keys are recognizable (and scannable
// by secret scanners) and distinguishable from JWTs.
const KeyPrefix = "gpx_"

var errUnauthorized = gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token")

// HashKey returns the stored form of a key: hex SHA-256. Keys carry 256
// random bits, so a fast hash is enough; no key is ever stored in clear.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// splitKey returns the id part of "gpx_<id>_<secret>".
func splitKey(key string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(key, KeyPrefix)
	if !ok {
		return "", false
	}
	id, secret, ok := strings.Cut(rest, "_")
	return id, ok && len(id) == 16 && len(secret) >= 32
}

// Authenticate turns a credential (an API key, or a JWT when enabled) into a
// Principal. Every failure is the same unauthorized error.
func (s *Service) Authenticate(ctx context.Context, credential string) (gpuproxy.Principal, error) {
	credential = strings.TrimSpace(credential)
	if credential == "" {
		return gpuproxy.Principal{}, errUnauthorized
	}
	if id, ok := splitKey(credential); ok {
		return s.authKey(ctx, id, credential)
	}
	if len(s.opts.JWTSecret) > 0 && strings.Count(credential, ".") == 2 {
		return s.authJWT(ctx, credential)
	}
	if s.opts.Tokens != nil {
		return s.authToken(ctx, credential)
	}
	return gpuproxy.Principal{}, errUnauthorized
}

// authToken authenticates an OAuth access token: the principal of the key
// that approved the client (its account, its id, so its per-key windows
// apply), with the token's scopes that the key still has.
func (s *Service) authToken(ctx context.Context, token string) (gpuproxy.Principal, error) {
	keyID, scopes, err := s.opts.Tokens.VerifyAccessToken(ctx, token)
	if err != nil {
		if gpuproxy.ErrorCode(err) == gpuproxy.EUNAUTHORIZED {
			return gpuproxy.Principal{}, errUnauthorized
		}
		return gpuproxy.Principal{}, err
	}
	p, err := s.KeyPrincipal(ctx, keyID)
	if err != nil {
		return p, err
	}
	var granted []gpuproxy.Scope
	for _, sc := range scopes {
		if p.Has(sc) {
			granted = append(granted, sc)
		}
	}
	p.Scopes = granted
	return p, nil
}

func (s *Service) authKey(ctx context.Context, id, credential string) (gpuproxy.Principal, error) {
	c, err := s.lookup(ctx, id, s.loadKey(id))
	if err != nil {
		return gpuproxy.Principal{}, err
	}
	k := c.key
	sum := digest(credential)
	if subtle.ConstantTimeCompare(sum[:], c.digest[:]) != 1 || !k.RevokedAt.IsZero() {
		return gpuproxy.Principal{}, errUnauthorized
	}
	return gpuproxy.Principal{AccountID: k.AccountID, AccountName: k.AccountName, KeyID: k.ID, Scopes: k.Scopes}, nil
}

// maxStackCredential is the longest credential digest hashes without a
// heap copy (an API key is 64 bytes).
const maxStackCredential = 128

// digest is the SHA-256 of a presented credential. A string's bytes are
// copied to be hashed; for a key-sized one the copy stays on the stack,
// which []byte(credential) does only up to 32 bytes: an allocation per
// authenticated request saved.
func digest(credential string) [sha256.Size]byte {
	if len(credential) > maxStackCredential {
		return sha256.Sum256([]byte(credential))
	}
	var buf [maxStackCredential]byte
	return sha256.Sum256(append(buf[:0], credential...))
}

// loadKey loads the stored key id for lookup.
func (s *Service) loadKey(id string) func(context.Context) (cached, error) {
	return func(ctx context.Context) (cached, error) {
		k, err := s.store.KeyByID(ctx, id)
		c := cached{key: k}
		if d, derr := hex.DecodeString(k.Hash); derr == nil && len(d) == sha256.Size {
			copy(c.digest[:], d) // otherwise all zeros: matches no credential
		}
		return c, err
	}
}

// KeyPrincipal returns the principal of the API key with this id after
// checking, as Authenticate does (cached for CacheTTL), that the key
// exists and is not revoked. It is for sessions that carry a key's id once
// the key itself was checked (the web console), so that revoking the key
// ends them. Every failure is the same unauthorized error.
func (s *Service) KeyPrincipal(ctx context.Context, id string) (gpuproxy.Principal, error) {
	if len(id) != 16 || strings.HasPrefix(id, "jwt:") {
		return gpuproxy.Principal{}, errUnauthorized
	}
	c, err := s.lookup(ctx, id, s.loadKey(id))
	if err != nil {
		return gpuproxy.Principal{}, err
	}
	k := c.key
	if !k.RevokedAt.IsZero() {
		return gpuproxy.Principal{}, errUnauthorized
	}
	return gpuproxy.Principal{AccountID: k.AccountID, AccountName: k.AccountName, KeyID: k.ID, Scopes: k.Scopes}, nil
}

func (s *Service) authJWT(ctx context.Context, token string) (gpuproxy.Principal, error) {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(token, claims, func(*jwt.Token) (any, error) { return s.opts.JWTSecret, nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithExpirationRequired(), jwt.WithTimeFunc(s.opts.Now))
	if err != nil {
		return gpuproxy.Principal{}, errUnauthorized
	}
	sub, _ := claims.GetSubject()
	scopeStr, _ := claims["scope"].(string)
	scopes, err := gpuproxy.ParseScopes(scopeStr)
	if sub == "" || err != nil {
		return gpuproxy.Principal{}, errUnauthorized
	}
	c, err := s.lookup(ctx, "jwt:"+sub, func(ctx context.Context) (cached, error) {
		a, err := s.store.AccountByName(ctx, sub)
		return cached{account: a}, err
	})
	if err != nil {
		return gpuproxy.Principal{}, err
	}
	acct := c.account
	jti, _ := claims["jti"].(string)
	return gpuproxy.Principal{AccountID: acct.ID, AccountName: acct.Name, KeyID: "jwt:" + sub + ":" + jti, Scopes: scopes}, nil
}

// loadTimeout bounds the store read of a credential not in the cache: a
// replica cut off from its database refuses the request (503) within it
// instead of waiting for the network to heal (fail closed).
const loadTimeout = 3 * time.Second

// lookup returns a cached credential record or loads it; a missing record
// is the generic unauthorized error, a store failure passes through (fail
// closed as unavailable).
func (s *Service) lookup(ctx context.Context, key string, load func(context.Context) (cached, error)) (cached, error) {
	now := s.opts.Now()
	if c, ok := s.cache.Load(key); ok && now.Before(c.(cached).until) {
		return c.(cached), nil
	}
	lctx, cancel := context.WithTimeout(ctx, loadTimeout)
	c, err := load(lctx)
	cancel()
	switch gpuproxy.ErrorCode(err) {
	case "":
	case gpuproxy.ENOTFOUND:
		return c, errUnauthorized
	default:
		return c, err
	}
	if s.opts.CacheTTL > 0 {
		c.until = now.Add(s.opts.CacheTTL)
		s.cache.Store(key, c)
	}
	return c, nil
}

// IssueJWT signs an HS256 token for account with scopes, valid for ttl.
func (s *Service) IssueJWT(account string, scopes []gpuproxy.Scope, ttl time.Duration) (string, error) {
	if len(s.opts.JWTSecret) == 0 {
		return "", gpuproxy.Errorf(gpuproxy.EINVALID, "JWT secret is not configured")
	}
	now := s.opts.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": account, "scope": gpuproxy.JoinScopes(scopes), "iat": now.Unix(), "exp": now.Add(ttl).Unix(),
	}).SignedString(s.opts.JWTSecret)
}

// CreateAccount creates a named account.
func (s *Service) CreateAccount(ctx context.Context, name string) (gpuproxy.Account, error) {
	if err := gpuproxy.ValidateAccountName(name); err != nil {
		return gpuproxy.Account{}, err
	}
	return s.store.CreateAccount(ctx, name, s.opts.Now())
}

// Account returns the named account.
func (s *Service) Account(ctx context.Context, name string) (gpuproxy.Account, error) {
	if err := gpuproxy.ValidateAccountName(name); err != nil {
		return gpuproxy.Account{}, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "account %q not found", name)
	}
	return s.store.AccountByName(ctx, name)
}

// Accounts lists every account.
func (s *Service) Accounts(ctx context.Context) ([]gpuproxy.Account, error) {
	return s.store.ListAccounts(ctx)
}

// CreateKey makes a new key for the named account and returns it in clear —
// the only time it is ever available — with its stored record.
func (s *Service) CreateKey(ctx context.Context, account, name string, scopes []gpuproxy.Scope) (string, gpuproxy.APIKey, error) {
	a, err := s.Account(ctx, account)
	if err != nil {
		return "", gpuproxy.APIKey{}, err
	}
	if len(scopes) == 0 {
		return "", gpuproxy.APIKey{}, gpuproxy.Invalid("scopes", "at least one scope is required")
	}
	if len(name) > 100 {
		return "", gpuproxy.APIKey{}, gpuproxy.Invalid("name", "must be at most 100 characters")
	}
	idb, secret := make([]byte, 8), make([]byte, 32)
	_, _ = rand.Read(idb)
	_, _ = rand.Read(secret)
	id := hex.EncodeToString(idb)
	plain := KeyPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(secret)
	k := gpuproxy.APIKey{ID: id, AccountID: a.ID, AccountName: a.Name, Name: name, Hash: HashKey(plain),
		Scopes: scopes, CreatedAt: s.opts.Now().UTC().Truncate(time.Microsecond)}
	if err := s.store.CreateKey(ctx, k); err != nil {
		return "", gpuproxy.APIKey{}, err
	}
	return plain, k, nil
}

// Key returns one key by id (never its secret), revoked or not.
func (s *Service) Key(ctx context.Context, id string) (gpuproxy.APIKey, error) {
	k, err := s.store.KeyByID(ctx, id)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return k, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "key %q not found", id)
	}
	return k, err
}

// SetConfirmAbove sets the cost above which a key's creates need a
// person's confirmation (nil removes it).
func (s *Service) SetConfirmAbove(ctx context.Context, accountID int64, keyID string, above *gpuproxy.Micros) error {
	if above != nil && (*above < 0 || *above > gpuproxy.MaxMicros) {
		return gpuproxy.Invalid("confirm_above", "%s", gpuproxy.AmountRange(0, gpuproxy.MaxMicros, false))
	}
	return s.store.SetKeyConfirmAbove(ctx, accountID, keyID, above)
}

// ConfirmAbove returns a key's confirmation threshold and whether it has one.
func (s *Service) ConfirmAbove(ctx context.Context, keyID string) (gpuproxy.Micros, bool, error) {
	return s.store.KeyConfirmAbove(ctx, keyID)
}

// ConfirmThresholds returns the thresholds of the account's keys that have one.
func (s *Service) ConfirmThresholds(ctx context.Context, accountID int64) (map[string]gpuproxy.Micros, error) {
	return s.store.KeyConfirmThresholds(ctx, accountID)
}

// Keys lists the named account's keys (never their secrets).
func (s *Service) Keys(ctx context.Context, account string) ([]gpuproxy.APIKey, error) {
	a, err := s.Account(ctx, account)
	if err != nil {
		return nil, err
	}
	return s.store.ListKeys(ctx, a.ID)
}

// RevokeKey revokes one of the named account's keys.
func (s *Service) RevokeKey(ctx context.Context, account, id string) error {
	a, err := s.Account(ctx, account)
	if err != nil {
		return err
	}
	if err := s.store.RevokeKey(ctx, a.ID, id, s.opts.Now()); err != nil {
		return err
	}
	s.cache.Delete(id)
	return nil
}
