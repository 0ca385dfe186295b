// Package idemqueue makes a message an at-least-once broker delivers, and
// delivers again, take effect once: its handler runs through an
// idem.Store under the message's own id, and the package answers what the
// broker must then do with it. Subpackages adapt it to brokers; this one
// imports none.
//
// A Consumer decides, for every delivery, one of three things:
//
//	what happened                                       Action   Replayed
//	the handler returned nil                            Ack
//	the id was done before: its result replayed         Ack      true
//	the handler returned idem.Final(err)                Reject
//	the id failed finally before: that error replayed   Reject   true
//	the id came with another payload (ErrPayloadMismatch),
//	  is not a valid key (ErrInvalidKey), or its payload
//	  cannot be fingerprinted (ErrInvalidPayload)       Reject
//	the handler failed (an error, a panic): the key
//	  is released for the next delivery                 Retry    (RetryDelay)
//	another delivery of the id runs now, here or in
//	  another process, and BusyWait passed or ctx
//	  ended first (ErrInProgress)                       Retry    (BusyDelay)
//	the store cannot answer (a *BackendError, ErrFull,
//	  ErrClosed, ctx ended)                             Retry    (RetryDelay)
//	an earlier delivery's process stopped mid-handler
//	  (ErrOutcomeUnknown): its effect may have happened Options.Reconcile decides;
//	                                                    by default Retry (InterruptedDelay)
//
// A handler that ran but whose outcome the store could not record is
// answered as done (Ack): the effect happened, and the store holds the
// outcome, keeps the claim and goes on recording it (idem.NotRecordedError).
//
// Ack removes the message for good. Reject ends it as a failure: the
// adapters ack it or, if told, dead-letter it. Retry asks for a redelivery
// after Delay, never at once: a redelivery that only meets the same busy
// key again would loop hot.
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
// postgres.RunOnceTx) commits them with its outcome, so a kill at any
// moment leaves neither; Consumer.Decide turns such a call's error into a
// Decision.
package idemqueue
