// Package limit holds the bounds the transports (idemhttp, idemgrpc) put on
// what one client can make a server hold: a quota of new keys per scope
// over a window, and a cap on the requests that wait on one key. Both
// count in this process only.
package limit
