package procstat

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPULimit is the CPUs this process's cgroup may use (its CFS quota over
// its period, the tightest of the cgroup and its parents), false when
// none is set or none can be read (no cgroup file system, not Linux).
func CPULimit() (float64, bool) {
	return cpuLimit("/proc/self/cgroup", "/sys/fs/cgroup")
}

// cpuLimit reads the membership file procCgroup and the quotas under the
// cgroup file system mounted at root: cgroup v2's cpu.max (root itself,
// or root/unified in the hybrid layout) and v1's
// cpu.cfs_quota_us / cpu.cfs_period_us under root/cpu (or cpu,cpuacct).
func cpuLimit(procCgroup, root string) (float64, bool) {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	best, found := 0.0, false
	take := func(l float64, ok bool) {
		if ok && (!found || l < best) {
			best, found = l, true
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			for _, base := range []string{root, filepath.Join(root, "unified")} {
				take(walkUp(base, parts[2], readCPUMax))
			}
		case hasController(parts[1], "cpu"):
			for _, mount := range []string{"cpu", "cpu,cpuacct", "cpuacct,cpu"} {
				take(walkUp(filepath.Join(root, mount), parts[2], readCFSQuota))
			}
		}
	}
	return best, found
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// walkUp applies read to the cgroup directory base/path and each parent up
// to base, and returns the tightest limit found. Inside a cgroup namespace
// the path is "/" and base is the process's own cgroup.
func walkUp(base, path string, read func(dir string) (float64, bool)) (float64, bool) {
	best, found := 0.0, false
	p := filepath.Clean("/" + path)
	for {
		if l, ok := read(filepath.Join(base, p)); ok && (!found || l < best) {
			best, found = l, true
		}
		if p == "/" {
			return best, found
		}
		p = filepath.Dir(p)
	}
}

// readCPUMax reads cgroup v2's "quota period" (quota "max": no limit).
func readCPUMax(dir string) (float64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(b)
	if len(f) != 2 || string(f[0]) == "max" {
		return 0, false
	}
	return ratio(string(f[0]), string(f[1]))
}

// readCFSQuota reads cgroup v1's quota and period (quota -1: no limit).
func readCFSQuota(dir string) (float64, bool) {
	q, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
	if err != nil {
		return 0, false
	}
	p, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
	if err != nil {
		return 0, false
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

// ratio is quota over period, both positive integers.
func ratio(quota, period string) (float64, bool) {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return float64(q) / float64(p), true
}
