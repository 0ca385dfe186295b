// Package multiproc holds the tests that run idem in several OS processes at
// once against the shared backends (PostgreSQL, Redis): the test binary
// re-executes itself as the processes. It has no API.
package multiproc
