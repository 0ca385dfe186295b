//go:build unix

package bench

import "syscall"

// cpuTime returns the CPU time this process has used, in all its threads
// (the collector's and the scheduler's spinning included), in
// nanoseconds; ok is false where it cannot be read.
func cpuTime() (ns int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
