// Package idemgrpc brings idempotency keys to gRPC: the gRPC halves of
// package idemhttp.
//
// On the server, UnaryServerInterceptor runs a unary method at most once per
// idempotency-key metadata value (within the caller's scope) and replays
// its response message, with the headers and trailers the handler set, to
// every retry; a replay carries the header idempotent-replayed: true, and a
// replayed error carries it in its trailers too, beside its status, where
// UnaryClientInterceptor looks to stop retrying. The statuses a client
// sees:
//
//   - InvalidArgument: the key is missing (when Required) or malformed, or
//     it was used before with a different request (method and message).
//   - Unauthenticated: Options.Scope could not tell who is calling. The
//     message is fixed; Scope's error goes to the log at Debug.
//   - Aborted, with a RetryInfo detail: a call with the key is still in
//     flight after Options.Wait; retry with the same key. A call whose own
//     deadline ends first gets DeadlineExceeded, as from gRPC itself.
//   - AlreadyExists, with idempotent-body-omitted: true: the call with the
//     key succeeded, but its response was larger than
//     Options.MaxStoredReply and was not kept (see BodyOmittedHeader).
//   - ResourceExhausted: the store holds as many keys in flight as it may.
//   - Unavailable: the store cannot be reached; retry with the same key.
//   - Internal: the handler panicked (the key is released), a call with
//     the key was interrupted and its outcome is unknown (an operator must
//     reconcile it), an operator settled the key with a final error (idem
//     resolve -error), or Options.Scope returned an empty scope, which is
//     what it returns when authentication did not run (logged at Error
//     once, then at Debug).
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
// What is remembered: the response message in wire form, held once, up to
// Options.MaxStoredReply (1 MiB unless set). A larger response goes whole
// to the call that ran the handler and is remembered without its message:
// the call is done and never runs again for its key, and every other call
// with the key, those that waited on it included, is answered
// AlreadyExists. The headers and trailers the handler set are remembered
// too, all of them or those Options.StoredMetadata names, but those
// Options.SkipMetadata names and those never stored: credentials
// (set-cookie, cookie, authorization, proxy-authorization,
// www-authenticate, proxy-authenticate, authentication-info,
// proxy-authentication-info), HTTP/2 connection headers, what gRPC makes
// for each response (content-type, user-agent, pseudo-headers, every
// grpc- key) and this package's own marks. The call that runs the handler
// sends its client everything the handler set; only what is remembered
// is filtered.
//
// # Transactional mode
//
// A handler that writes to the same database as the store's Backend
// (PostgreSQL, MySQL or SQLite) can have its rows, its key and its reply
// committed in one transaction: set Options.InTx to the InTx of the
// Backend's package and write through the transaction its TxFromContext
// finds in the handler's ctx. The interceptor holds the headers and
// trailers the handler sets (SendHeader's too) and answers only once that
// transaction has committed, so a crash at any instant leaves either
// nothing (a retry runs the handler afresh) or everything (a retry
// replays the reply). Without it, a crash after the handler's own commit
// and before its reply is recorded leaves the key interrupted: its
// retries are answered Internal, "its outcome is unknown", until an
// operator settles the key.
//
// What is kept is what is kept without it, and the rest is never kept by
// halves:
//   - A response, or an error marked idem.Final, commits with the
//     handler's rows: a final error is the call's answer, as a 4xx is an
//     HTTP handler's, so what the handler wrote before returning it
//     (a declined payment's record, say) is kept with it; a handler that
//     wants nothing kept returns another error. A response larger than
//     Options.MaxStoredReply commits as done without its message, as
//     above: the call that ran it gets it whole.
//   - Any other error, a panic, or a handler still running at the store's
//     ExecutionTimeout rolls its rows back with the claim: nothing is
//     remembered, and the key is free for the retry. The error goes to the
//     client as the handler returned it, with the metadata it set; a panic
//     is Internal, without it.
//   - A transaction that does not commit, because the commit failed or
//     the handler ended the transaction itself, is answered Unavailable,
//     with nothing of the handler's answer. The handler must not commit
//     or roll back: on PostgreSQL and SQLite that only makes the call
//     fail with nothing committed, but on MySQL a COMMIT (or DDL, which
//     commits) keeps its rows with a key that has no outcome, which is
//     then interrupted, as it would be without InTx.
//   - A call to a remote service cannot be in the transaction: make it
//     before, or through idem.Step with a StepKey the other service
//     honours, so that a retry does not repeat it.
//
// A caller whose context is cancelled does not stop the handler: its
// reply is committed, and the retry replays it. The handler still runs
// under the caller's deadline, so a handler that heeds it fails when it
// passes and rolls back. A duplicate waits for the transaction to end (up
// to Options.Wait, or its own deadline) and replays its reply, or runs the
// handler itself if it rolled back.
//
// On the client, UnaryClientInterceptor gives each logical call one key (or
// keeps the caller's) and sends it on every attempt: its own retries of
// Unavailable and Aborted, and gRPC's retry policy, which resends the same
// metadata.
//
// Streaming calls pass through both interceptors untouched: a stream has no
// single response to replay.
package idemgrpc
