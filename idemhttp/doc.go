// Package idemhttp brings idempotency keys to net/http, both halves of them.
//
// On the server, Middleware runs a POST or PATCH handler at most once per
// Idempotency-Key header and replays its stored response (status, allowed
// headers, body) to every retry, marked Idempotent-Replayed: true. It
// follows the IETF Idempotency-Key header draft and payment APIs' practice:
// a missing key where one is required, or a malformed one, is 400; the same
// key while the first request is in flight waits a bound for its outcome,
// then 409 with Retry-After; the same key with a different request is 422.
//
// Keys are joined to a scope, such as the authenticated account, given by
// Options.Scope, so that one client can never read another's stored
// response. Set it on any server that more than one client can reach.
//
// On the client, Transport makes one key per logical request (or uses the
// caller's) and sends it on every attempt, retrying only the outcomes that
// leave the result unknown.
package idemhttp
