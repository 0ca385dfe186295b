// Package idemgrpc brings idempotency keys to gRPC: the gRPC halves of
// package idemhttp.
//
// On the server, UnaryServerInterceptor runs a unary method at most once per
// idempotency-key metadata value (within the caller's scope) and replays
// its response message, with the headers and trailers the handler set, to
// every retry; a replay carries the header idempotent-replayed: true. The
// statuses a client sees:
//
//   - InvalidArgument: the key is missing (when Required) or malformed, or
//     it was used before with a different request (method and message).
//   - Aborted, with a RetryInfo detail: a call with the key is still in
//     flight after Options.Wait; retry with the same key. A call whose own
//     deadline ends first gets DeadlineExceeded, as from gRPC itself.
//   - ResourceExhausted: the store holds as many keys in flight as it may.
//   - Unavailable: the store cannot be reached; retry with the same key.
//   - Internal: the handler panicked (the key is released), or a call with
//     the key was interrupted and its outcome is unknown (an operator must
//     reconcile it).
//
// The handler runs under the caller's deadline, not its cancellation. A
// duplicate that waited on an execution that ran out of its caller's time
// (DeadlineExceeded, which releases the key) claims the key again while it
// has time of its own.
//
// A handler's response is remembered; so is an error marked idem.Final,
// with its status code and message. Any other error releases the key, so
// that a retry runs the handler again.
//
// On the client, UnaryClientInterceptor gives each logical call one key (or
// keeps the caller's) and sends it on every attempt: its own retries of
// Unavailable and Aborted, and gRPC's retry policy, which resends the same
// metadata.
//
// Streaming calls pass through both interceptors untouched: a stream has no
// single response to replay.
package idemgrpc
