//go:build !unix

package bolt

import "time"

// holdLock does nothing where flock is not: bbolt's own lock, taken at
// bbolt.Open, is all there is, and a check may read a live writer's pages
// (openChecked checks again if the file changed meanwhile).
func holdLock(string, bool, time.Duration) (func(), error) { return func() {}, nil }
