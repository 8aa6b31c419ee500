//go:build !unix

package observe

// diskSpace is not measured on this platform.
func diskSpace(string) (free, size float64, ok bool) { return 0, 0, false }
