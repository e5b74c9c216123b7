package oauth

import (
	"context"
	"net/url"

	"github.com/aiserve/gpuproxy"
)

// Consent is an authorization request as the console's consent page shows
// it to the person asked to approve it.
type Consent struct {
	ID          string
	ClientID    string
	ClientName  string
	RedirectURI string // where the answer goes
	Scopes      []gpuproxy.Scope
}

// Pending returns an unexpired, unanswered authorization request.
func (s *Server) Pending(ctx context.Context, id string) (Consent, error) {
	r, err := s.store.OAuthRequest(ctx, id, s.opts.Now())
	if err == nil && !r.ApprovedAt.IsZero() {
		err = gpuproxy.Errorf(gpuproxy.ENOTFOUND, "this authorization request was already answered")
	}
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return Consent{}, gpuproxy.Errorf(gpuproxy.ENOTFOUND,
			"this authorization request is unknown, expired (they last 10 minutes) or already answered; start again from the client")
	}
	if err != nil {
		return Consent{}, err
	}
	c, err := s.store.OAuthClient(ctx, r.ClientID)
	if err != nil {
		return Consent{}, err
	}
	return Consent{ID: r.ID, ClientID: c.ID, ClientName: c.Name, RedirectURI: r.RedirectURI, Scopes: r.Scopes}, nil
}

// Approve records that the person signed in as p approved the request: the
// client's tokens will act for p's key, with the requested scopes p has.
// It returns where to send the browser next (the code goes to the client
// from there).
func (s *Server) Approve(ctx context.Context, id string, p gpuproxy.Principal) (string, error) {
	r, err := s.store.OAuthRequest(ctx, id, s.opts.Now())
	if err != nil {
		return "", err
	}
	granted := within(r.Scopes, p.Scopes)
	if len(granted) == 0 {
		return "", gpuproxy.Errorf(gpuproxy.EFORBIDDEN, "the key you signed in with has none of the scopes this client asks for; sign in with another key")
	}
	if err := s.store.ApproveOAuthRequest(ctx, id, p.KeyID, granted, s.opts.Now()); err != nil {
		return "", err
	}
	s.log.Info("oauth client approved", "client_id", r.ClientID, "key_id", p.KeyID, "account_id", p.AccountID,
		"scopes", gpuproxy.JoinScopes(granted))
	return AuthorizePath + "/callback?id=" + url.QueryEscape(id), nil
}

// Deny ends the request and returns the client's redirect carrying
// access_denied (RFC 6749 §4.1.2.1).
func (s *Server) Deny(ctx context.Context, id string) (string, error) {
	r, err := s.store.OAuthRequest(ctx, id, s.opts.Now())
	if err != nil {
		return "", err
	}
	if err := s.store.DeleteOAuthRequest(ctx, id); err != nil {
		return "", err
	}
	u, err := url.Parse(r.RedirectURI)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("error", "access_denied")
	q.Set("error_description", "the person declined")
	if r.State != "" {
		q.Set("state", r.State)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Grants lists the clients connected with keyID's approval.
func (s *Server) Grants(ctx context.Context, keyID string) ([]gpuproxy.OAuthGrant, error) {
	return s.store.OAuthGrants(ctx, keyID, s.opts.Now())
}

// RevokeGrant disconnects a client keyID approved: every token of the
// grant stops working at once.
func (s *Server) RevokeGrant(ctx context.Context, keyID, grantID string) error {
	defer s.tokens.clear()
	if err := s.store.RevokeKeyOAuthGrant(ctx, keyID, grantID, s.opts.Now()); err != nil {
		return err
	}
	s.log.Info("oauth grant revoked on the console", "key_id", keyID, "grant_id", grantID)
	return nil
}
