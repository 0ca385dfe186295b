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
// # Transactional mode
//
// A handler that writes to the same database as the store's Backend
// (PostgreSQL, MySQL or SQLite) can have its rows, its key and its
// response committed in one transaction: set Options.InTx to the InTx of
// the Backend's package and write through the transaction its
// TxFromContext finds in the request's context. The middleware holds the
// response until that transaction commits, and sends it only then, so a
// crash at any instant leaves either nothing (a retry runs the handler
// afresh) or everything (a retry replays the response). Without it, a
// crash after the handler's own commit and before its response is
// recorded leaves the key interrupted: its retries are answered 500, "its
// outcome is unknown", until an operator settles the key.
//
// The transaction holds only what can wait for its commit, and the rest
// is refused, never kept by halves:
//   - A response that is not remembered (a 5xx, a 408, 409, 425 or 429,
//     as a framework renders a handler's error), a panic, or a handler
//     still running at the store's ExecutionTimeout rolls its rows back
//     with the claim: nothing
//     is remembered, and the key is free for the retry. A 5xx goes to the
//     client as the handler wrote it; a panic is 500; a handler that ran
//     past ExecutionTimeout is 503 with Retry-After, whatever it wrote.
//   - A response streamed (Flush) or a connection taken over (Hijack) is
//     refused at once (FlushError and Hijack return an error, and every
//     Write after them fails), and so is a body larger than
//     Options.MaxStoredBody (the Write past it fails): the request is
//     answered 500 and its rows roll back.
//   - The handler must not commit or roll back the transaction itself. On
//     PostgreSQL it holds a savepoint, so its Commit or Rollback only makes
//     the request fail (503) with nothing committed; on SQLite its commit
//     is refused, and either makes the request fail (503) with nothing
//     committed. On MySQL a ROLLBACK does the same, but a COMMIT (or DDL,
//     which commits) commits its rows with a claim that has no outcome:
//     the key is then interrupted, as it would be without InTx, and the
//     request and its retries are answered 500, "its outcome is unknown",
//     until an operator settles the key. On PostgreSQL a ROLLBACK sent
//     as raw SQL (not through the transaction's Rollback) ends the
//     transaction, claim and all, and what the handler writes after it
//     commits on its own, outside any key, so a retry writes it again.
//     Send no BEGIN, COMMIT or ROLLBACK statement of your own.
//   - A remembered response (2xx, 3xx, and 4xx but those above) commits
//     with the rows the handler wrote, as it would without InTx: an error
//     the framework renders as a 4xx, such as echo's HTTPError(402),
//     keeps them. Roll back by answering 5xx.
//   - A call to a remote service cannot be in the transaction: make it
//     before, or through idem.Step with a StepKey the other service
//     honours, so that a retry does not repeat it.
//
// The response goes out as net/http would have sent it unheld: the
// headers as they stood at WriteHeader, the body, then the trailers.
// A client that hangs up does not stop the handler: its response is
// committed, and the retry replays it. A duplicate waits for the
// transaction to end (up to Options.Wait, then 409) and replays its
// response. If the transaction rolled back, the key is free: a duplicate
// waiting in the same process is given the first request's 5xx, or 500
// for a panic, or 503 with Retry-After for a response refused, while one
// in another process runs the handler itself; one whose wait ended first
// never runs it.
//
// On the client, Transport makes one key per logical request (or uses the
// caller's) and sends it on every attempt, retrying only the outcomes that
// leave the result unknown.
package idemhttp
