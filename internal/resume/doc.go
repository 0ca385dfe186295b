// Package resume holds the tests that kill a process at every boundary of
// an operation's steps (before, inside and after each) and check that the
// next call, in another process, resumes it: each step's side effect, on a
// fake outside service that honours idempotency keys, happens once. The
// test binary re-executes itself as the process that is killed. It has no
// API.
package resume
