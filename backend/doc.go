// Package backend is what a durable store for package idem implements: the
// Backend interface, the Record it keeps per key, the record states, and a
// compact binary encoding of records for stores that keep opaque values.
//
// Users of idem do not need this package: they pass a ready backend
// (bolt.Open, postgres.New, redis.New) as idem.Options.Backend. It is for
// those who write one, as database/sql/driver is for driver authors. Package
// idemtest holds the conformance suite every Backend must pass.
package backend
