// Package npmenv installs the npm packages a test runs against (an
// independent reference implementation, an SDK) from a committed
// package-lock.json, once per machine: into the user's cache directory,
// keyed by the content of the files copied there, so a changed lock file
// installs anew and an unchanged one costs nothing.
package npmenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrNoNode: node or npm is not installed; callers skip.
var ErrNoNode = errors.New("node or npm is not installed")

// ErrOffline wraps an npm ci that could not reach its registry; callers
// skip.
var ErrOffline = errors.New("npm could not reach its registry")

// Install copies files (package.json, package-lock.json and any scripts)
// from src into <cache>/tether-test/<name>-<hash of their content>, runs
// `npm ci --ignore-scripts` there unless a previous install completed, and
// returns the directory. Errors: ErrNoNode, ErrOffline (wrapped, with
// npm's output), or another install failure with npm's output.
func Install(ctx context.Context, src, name string, files ...string) (string, error) {
	return InstallTrusting(ctx, src, name, nil, files...)
}

// InstallTrusting is Install that then runs the install scripts of the
// packages named in trusted (`npm rebuild`): a package whose postinstall
// puts its real program in place (Claude Code copies its platform's native
// binary over a placeholder) works only after it.
func InstallTrusting(ctx context.Context, src, name string, trusted []string, files ...string) (string, error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrNoNode, tool, err)
		}
	}
	h := sha256.New()
	contents := make(map[string][]byte, len(files))
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		contents[f] = data
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
	}
	for _, p := range trusted {
		fmt.Fprintf(h, "trusted\x00%s\x00", p)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "tether-test", name+"-"+hex.EncodeToString(h.Sum(nil)[:8]))
	marker := filepath.Join(dir, ".installed") // written after a complete install
	if _, err := os.Stat(marker); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for f, data := range contents {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			return "", err
		}
	}
	if err := npm(ctx, dir, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"); err != nil {
		return "", err
	}
	if len(trusted) > 0 {
		if err := npm(ctx, dir, append([]string{"rebuild", "--loglevel=error"}, trusted...)...); err != nil {
			return "", err
		}
	}
	return dir, os.WriteFile(marker, nil, 0o644)
}

// npm runs npm with args in dir; a failure to reach the registry wraps
// ErrOffline.
func npm(ctx context.Context, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, "npm", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	msg := tail(string(out), 4000)
	for _, offline := range []string{"ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "network", "fetch failed"} {
		if strings.Contains(msg, offline) {
			return fmt.Errorf("%w: npm %s in %s: %v\n%s", ErrOffline, args[0], dir, err, msg)
		}
	}
	return fmt.Errorf("npm %s in %s: %v\n%s", args[0], dir, err, msg)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
