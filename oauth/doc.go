// Package oauth is gpuproxy's OAuth 2.1 authorization server for remote
// MCP clients (the MCP authorization spec), built on zitadel/oidc's op
// package:
//
//   - protected-resource metadata (RFC 9728) at
//     /.well-known/oauth-protected-resource, naming /mcp as the resource
//     and this server as its authorization server;
//   - authorization-server metadata (RFC 8414) at
//     /.well-known/oauth-authorization-server;
//   - dynamic client registration (RFC 7591) at POST /oauth/register;
//   - the authorization code grant with PKCE (S256 only) at
//     /oauth/authorize, whose consent step is the web console: a person
//     signs in there with an API key and approves the client and scopes;
//   - short-lived opaque access tokens and rotating refresh tokens (a
//     refresh token works once; using one twice revokes its whole grant)
//     at /oauth/token, revocation at /oauth/revoke.
//
// A token acts for the approving key: its account, at most its scopes,
// and its per-key spending windows. Revoking the key ends every token it
// approved. Every replica shares the state through the store; only hashes
// of secrets, codes and tokens are stored.
package oauth
