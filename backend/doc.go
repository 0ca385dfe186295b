// Package backend is what a durable store for package idem implements: the
// Backend interface, the Record it keeps per key, the record states, and a
// compact binary encoding of records for stores that keep opaque values.
//
// Users of idem do not need this package: they pass a ready backend
// (bolt.Open, postgres.New, redis.New) as idem.Options.Backend. It is for
// those who write one, as database/sql/driver is for driver authors. Package
// idemtest holds the conformance suite every Backend must pass.
//
// # Rules
//
// The rules a backend applies to a key's record before it writes are
// methods of Record, so that a backend calls them rather than spelling them
// out: Settleable (may Complete or Release settle it under this token),
// ClaimedBy (may Renew extend it), HeldBy (may RecordStep add to it),
// Live (does Forget refuse it), Resumable, Lapsed and Expired, SeenAt (how
// Get and Claim report it at now), and WithOwnerDead (a record whose owner
// is proven dead). A backend that decides in its server, in SQL or a
// script, states the same rules there.
//
// # What each method does in each state
//
// A key's record, as the backend's clock sees it at the call, is in one of
// six states: absent; pending with its lease holding (or no lease);
// pending with its lease lapsed; interrupted (stored so, its owner proven
// dead); completed and not yet expired; completed and expired. T is the
// record's own token: a call that presents another gets ErrNotOwner and
// changes nothing, in every state.
//
//	               absent    pending   pending   interrupted  completed  completed
//	                         live      lapsed                 live       expired
//	Claim          new       standing  standing  standing     standing   new
//	Complete(T)    NotOwner  done      done      done         NotOwner   NotOwner
//	Release(T)     NotOwner  deleted   deleted   deleted      NotOwner   NotOwner
//	Renew(T)       NotOwner  renewed   renewed   NotOwner     NotOwner   NotOwner
//	Get            false     pending   interr.   interr.      completed  false
//	Forget         nil       InProg    deleted   deleted      deleted    deleted
//	Sweep          -         kept      kept      kept         kept       deleted
//	Each           -         pending   pending   interr.      completed  listed
//	RecordStep(T)  NotOwner  recorded  NotOwner  NotOwner     NotOwner   NotOwner
//	Resume(T)      NotOwner  NotOwner  resumed   resumed      NotOwner   NotOwner
//
// Claim "new" stores a pending record of the caller's token, created at
// the backend's now, and returns it with true; "standing" stores nothing
// and returns the record with false, a lapsed one as interrupted (its
// LeaseUntil kept). A standing record that holds the caller's token is
// its own earlier attempt, and the caller owns it.
//
// Complete "done" stores the outcome, completed and expiring a TTL after
// the backend's now, keeping the Fingerprint, Token and CreatedAt.
// Renew "renewed" sets the lease a lease after the backend's now, lapsed
// or not: a lapse judged by a clock that stepped is no proof of death.
// RecordStep "recorded" adds the step, or replaces the one of its name.
// Resume "resumed" gives the record the new token, a new lease and State
// pending, keeping the rest; of concurrent Resumes, exactly one wins.
//
// Get "interr." returns the record with State StateInterrupted (a lapsed
// one keeps its LeaseUntil; one whose owner is proven dead has none), and
// "false" means no record. Forget "InProg" is an error matching
// ErrInProgress, and "nil" no error. Sweep deletes expired completed
// records only, oldest expiry first, at most its limit; a SelfExpiring
// backend's store deletes them by itself, and its Sweep finds none.
// Each lists records as stored: a lapsed claim as pending, an expired
// outcome until it is swept.
//
// In every state, every method (the optional ones included) given a ctx
// that has already ended returns an error matching both the ctx's error
// and ErrRefused, and changes nothing; after the backend is closed, an
// error matching ErrClosed. A backend that reopens after its process died,
// and can prove the owners of its pending records dead (as a file lock
// does), stores them interrupted with no lease.
package backend
