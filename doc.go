// Package idem makes retried operations safe.
//
// A caller names one logical operation with an idempotency key and sends the
// same key on every retry. [Store.RunOnce] claims the key before the operation
// runs, so one key produces at most one side effect, and every caller with
// that key gets the first execution's answer:
//
//   - Concurrent duplicates coalesce: they wait for the one execution in
//     flight instead of starting another.
//   - A key reused with a different payload is refused with
//     [ErrPayloadMismatch] rather than answered with another request's result.
//   - A failure before commit (an ordinary error or a panic) releases the key,
//     so the next retry runs the operation again. Only a success or an error
//     marked with [Final] is remembered and replayed.
//   - Outcomes are remembered for a TTL, then the key may be used afresh.
//   - No caller's cancellation stops the shared execution: a caller whose
//     context ends stops waiting and gets an error that is both
//     [ErrInProgress] and the context's error, while the operation goes on
//     for everyone else.
//
// A Store is safe for use by many goroutines. The zero [Options] keep
// outcomes in memory for 24 hours.
//
// # Two phases
//
// RunOnce takes the operation as a closure. A caller whose work does not fit
// in one, such as a queue consumer or a handler that streams its response,
// uses the two halves RunOnce is made of: [Store.Begin] claims the key (or
// returns the remembered outcome in a [Ticket]), the caller works in its
// own control flow under [Ticket.Context], and [Ticket.Finish] records the
// outcome or releases the key. A deferred [Ticket.Release] covers a panic
// or an early return. The rules are RunOnce's in every respect.
//
// # Durability
//
// With Options.Backend set, the claim is durable before fn runs and the
// outcome is durable before RunOnce returns, so what the store promised
// survives a restart: package bolt keeps records in a local bbolt file,
// package sqlite in a SQLite database file, and packages postgres, mysql
// and redis in a database that many processes and machines share. A key
// whose owner died between the two is interrupted: RunOnce answers
// [ErrOutcomeUnknown] and does not run fn until an operator calls
// [Store.Forget] (or Options.RetryInterrupted allows a second run). Package
// idemtest holds the conformance suite every [backend.Backend] must pass;
// package backend is what a backend author implements.
package idem
