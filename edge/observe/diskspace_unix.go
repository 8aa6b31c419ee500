//go:build unix

package observe

import "golang.org/x/sys/unix"

// diskSpace reports the bytes available to this process and the size of the
// file system holding dir.
func diskSpace(dir string) (free, size float64, ok bool) {
	if dir == "" {
		return 0, 0, false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, false
	}
	return float64(st.Bavail) * float64(st.Bsize), float64(st.Blocks) * float64(st.Bsize), true
}
