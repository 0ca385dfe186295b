//go:build !unix

package bench

// cpuTime cannot be read here: forEach reports no cpu-ns/op.
func cpuTime() (int64, bool) { return 0, false }
