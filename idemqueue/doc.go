// Package idemqueue makes a message an at-least-once broker delivers, and
// delivers again, take effect once: its handler runs through an
// idem.Store under the message's own id, and the package answers what the
// broker must then do with it. Subpackages adapt it to brokers; this one
// imports none.
//
// A Consumer decides, for every delivery, one of four things:
//
//	what happened                                       Action   Replayed
//	the handler returned nil                            Ack
//	the id was done before: its result replayed         Ack      true
//	the handler returned idem.Final(err)                Reject
//	the id failed finally before: that error replayed   Reject   true
//	the store refused the message before any handler
//	  ran: the id came with another payload
//	  (ErrPayloadMismatch), or its payload cannot be
//	  fingerprinted (ErrInvalidPayload)                 Reject
//	the message has no id, or one that is not a valid
//	  key (ErrInvalidKey): nothing tells its
//	  deliveries apart                                  Hold     (InterruptedDelay)
//	the handler failed (an error, a panic), whatever
//	  its error wraps: the key is released for the
//	  next delivery                                     Retry    (RetryDelay)
//	another delivery of the id runs now, here or in
//	  another process, and BusyWait passed or ctx
//	  ended first (ErrInProgress)                       Retry    (BusyDelay)
//	the store cannot answer (a *BackendError, ErrFull,
//	  ErrClosed, ctx ended)                             Retry    (RetryDelay)
//	an earlier delivery's process stopped mid-handler
//	  (ErrOutcomeUnknown): its effect may have happened Options.Reconcile decides;
//	                                                    by default Retry (InterruptedDelay)
//
// The store's refusals are told from the handler's errors by where they
// came from, not by what they wrap: a handler whose error wraps
// ErrPayloadMismatch (say, from an idempotent call it made downstream)
// failed, and nothing was recorded, so its message is retried. Handle
// knows which phase an error came from (the claim, or the handler);
// HandleTx, whose call does both, judges a refusal, or an interruption,
// by the store's state (the key, the payload's fingerprint, the key's
// record), and Decide, given neither phase nor payload, takes none for a
// refusal: it retries.
//
// A handler that ran but whose outcome the store could not record is
// answered as done (Ack): the effect happened, and the store holds the
// outcome, keeps the claim and goes on recording it (idem.NotRecordedError).
//
// Ack removes the message for good. Reject ends it as a failure: the
// adapters ack it or, if told, dead-letter it. Hold leaves a message whose
// work did not happen, and never can as it is, for an operator; it is
// never acked. What each adapter does with it:
//
//	idemnats    NakWithDelay(InterruptedDelay), again and again (never
//	            Term, which deletes a message from a work-queue
//	            stream); the consumer's MaxDeliver bounds it
//	idemrabbit  with DeadLetter, Nack without requeue (the queue's
//	            dead-letter exchange takes it); else a retry after
//	            InterruptedDelay, again and again
//
// A key function the adapter is given (their Options.Key) may derive the
// key from the body when the header is missing, and so handle such
// messages instead. Retry asks for a redelivery after Delay, never at
// once: a redelivery that only meets the same busy key again would loop
// hot.
//
// An interrupted id (ErrOutcomeUnknown) is what a killed consumer leaves:
// the default keeps it for an operator (idem inspect, idem resolve) and
// retries later, so the message is neither lost nor dead-lettered. A
// Store with Options.Resume resumes it instead, from its last recovery
// point (idem.Step), and the Consumer never sees it; Reconcile may also
// settle it itself, with Store.Resolve or Store.Forget.
//
// A restarted consumer does not take its dead predecessor's claims over
// before their leases lapse (idem.Options.Lease, 30 seconds by default,
// renewed while a handler runs): it retries them later (BusyDelay), and
// only bolt reads them as interrupted at once, at Open. A claim may be
// taken early only on proof that its owner is dead, and the proof must be
// a lock the owner held and lost with its life: bolt's lock on its file
// is one. A process's name, host or pod is not: under a rolling deploy, a
// paused VM or a partition, the "dead" predecessor with the same name
// still runs, and would apply its effect beside the new one's. Where that
// wait matters, a shorter Lease shortens it.
//
// Local effects exactly once: a handler whose writes go to the same
// database as the key (sqlite.RunOnceTx, bolt.RunOnceTx,
// postgres.RunOnceTx, mysql.RunOnceTx) commits them with its outcome, so
// a kill at any moment leaves neither. NewTx makes a TxConsumer whose
// handler is given the backend's own transaction, typed, and refuses a
// store on another backend when it is made; Consumer.HandleTx runs such
// a call written by hand. Both report a replay (Decision.Replayed). The
// adapters' NewTx build on it, from a store to a worker in one call:
//
//	c, err := idemnats.NewTx(store, sqlite.RunOnceTx[Receipt], idemnats.Options{})
//	d, err := c.Handle(ctx, msg, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) (Receipt, error) { ... })
package idemqueue
