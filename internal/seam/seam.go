// Package seam is where package idem hands this module's transactional
// modes (bolt, sqlite and postgres RunOnceTx, through internal/txrun) what
// they need of a Store beyond its users' API: a claim in memory only, the
// Codec, the options with their defaults. It holds one variable so that
// idem, which sets it, and txrun, which reads it, need not import each
// other's internals; see txrun.Of for the typed view.
package seam

// Local returns the transactional view of an *idem.Store[R], or nil for
// anything else. Package idem sets it in an init function.
var Local func(store any) any
