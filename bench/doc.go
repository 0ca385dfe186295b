// Package bench measures idem against the baselines an expert would name:
// golang.org/x/sync/singleflight, and a plain mutex-guarded map that claims,
// runs, stores and keeps. It holds benchmarks only; see README.md in this
// directory for the figures and the command that made them.
package bench
