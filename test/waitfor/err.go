package waitfor

import "time"

// Err calls try until it returns nil or timeout passes, and returns its last
// error: for a wait whose failure the caller reports (a goroutine other than
// the test's, or a helper that returns errors).
func Err(timeout time.Duration, try func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := try()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(poll)
	}
}
