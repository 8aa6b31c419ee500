// Package monitoring tests the shipped Grafana dashboards (deploy/grafana)
// and Prometheus rules (deploy/prometheus) against a real Prometheus
// (Debian's prometheus package) scraping an in-process dev stack: promtool
// checks and unit-tests the rules, Prometheus runs deploy/prometheus's
// configuration against the stack, and every dashboard and rule expression
// must return a series once traffic has flowed. The tests live in
// _test.go files; this file finds (or installs) the binaries.
package monitoring

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ErrNoPrometheus: prometheus or promtool is not installed and could not
// be installed here; callers skip outside CI and fail in it.
var ErrNoPrometheus = errors.New("prometheus and promtool are not installed")

// Binaries returns the paths of prometheus and promtool. When either is
// missing and this process runs as root with apt-get (CI's machine and the
// developers'), it installs Debian's prometheus package first (apt-get
// update only when the package is not known yet).
func Binaries() (prometheus, promtool string, err error) {
	if prometheus, promtool, err = lookup(); err == nil {
		return prometheus, promtool, nil
	}
	apt, aerr := exec.LookPath("apt-get")
	if aerr != nil || os.Geteuid() != 0 {
		return "", "", fmt.Errorf("%w (%v; not root with apt-get, so not installing Debian's prometheus package)", ErrNoPrometheus, err)
	}
	install := func() ([]byte, error) {
		cmd := exec.Command(apt, "install", "-y", "-q", "--no-install-recommends", "prometheus")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	out, ierr := install()
	if ierr != nil {
		if uout, uerr := exec.Command(apt, "update", "-q").CombinedOutput(); uerr != nil {
			return "", "", fmt.Errorf("%w: apt-get update: %v\n%s", ErrNoPrometheus, uerr, tail(uout))
		}
		if out, ierr = install(); ierr != nil {
			return "", "", fmt.Errorf("%w: apt-get install prometheus: %v\n%s", ErrNoPrometheus, ierr, tail(out))
		}
	}
	return lookup()
}

func lookup() (prometheus, promtool string, err error) {
	if prometheus, err = exec.LookPath("prometheus"); err != nil {
		return "", "", err
	}
	if promtool, err = exec.LookPath("promtool"); err != nil {
		return "", "", err
	}
	return prometheus, promtool, nil
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}
