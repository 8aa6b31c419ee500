// Package image checks the container image's recipe without a container
// engine: `make image` runs `make build-static` (the static binary) and
// `docker build`; the Dockerfile copies that binary onto scratch. The test
// builds the binary with the Makefile's own command, checks that it is
// statically linked (no interpreter, no shared libraries: it runs on an
// empty base), and reads the Dockerfile's instructions: FROM scratch, the
// COPY of exactly that binary to the ENTRYPOINT, a non-root numeric USER, no
// RUN (scratch has no shell), the ports deploy/ listens on; and the build
// context (.dockerignore) holds the binary only.
package image

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var root = filepath.Join("..", "..")

// makeCommands are the commands `make -n` prints for targets.
func makeCommands(t *testing.T, targets ...string) []string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("make is required in CI")
		}
		t.Skip("make not installed")
	}
	// Under `make test` the environment carries MAKELEVEL and MAKEFLAGS, and
	// a sub-make prints "Entering/Leaving directory" lines among the
	// commands; the listing is taken as a top-level make would print it.
	cmd := exec.Command("make", append([]string{"-n", "--no-print-directory"}, targets...)...)
	cmd.Dir = root
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "MAKELEVEL=") || strings.HasPrefix(kv, "MAKEFLAGS=") || strings.HasPrefix(kv, "MFLAGS=")
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %v: %v\n%s", targets, err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func TestStaticBinaryAsTheMakefileBuildsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmds := makeCommands(t, "image")
	i := slices.IndexFunc(cmds, func(c string) bool { return strings.Contains(c, " build ") && strings.Contains(c, "./cmd/tether") })
	if i < 0 {
		t.Fatalf("make image builds no ./cmd/tether: %q", cmds)
	}
	build := cmds[i]
	for _, want := range []string{"CGO_ENABLED=0", "GOOS=linux", "-o bin/tether-static"} {
		if !strings.Contains(build, want) {
			t.Fatalf("make build-static: %q lacks %s", build, want)
		}
	}
	if last := cmds[len(cmds)-1]; !strings.HasPrefix(last, "docker build ") || !strings.HasSuffix(last, " .") {
		t.Fatalf("make image ends with %q, want docker build of this directory", last)
	}
	// Build it as the Makefile says, into a temporary file.
	out := filepath.Join(t.TempDir(), "tether-static")
	line := strings.Replace(build, "-o bin/tether-static", "-o "+out, 1)
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the binary needs shared libraries %v", libs)
	}
	if run := exec.Command(out, "version"); true {
		if b, err := run.CombinedOutput(); err != nil || !strings.Contains(string(b), "tether") {
			t.Fatalf("tether version: %v %s", err, b)
		}
	}
}

type instruction struct {
	cmd  string
	args string
	line int
}

// parseDockerfile reads instructions: comments and blank lines skipped,
// backslash continuations joined.
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	sc := bufio.NewScanner(f)
	n, pending, start := 0, "", 0
	for sc.Scan() {
		n++
		l := strings.TrimSpace(sc.Text())
		if pending == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if pending == "" {
			start = n
		}
		if cont, ok := strings.CutSuffix(l, "\\"); ok {
			pending += cont + " "
			continue
		}
		full := pending + l
		pending = ""
		cmd, args, _ := strings.Cut(full, " ")
		if strings.ToUpper(cmd) != cmd {
			t.Errorf("Dockerfile:%d: instruction %q not upper case", start, cmd)
		}
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args), start})
	}
	if pending != "" {
		t.Error("Dockerfile ends inside a line continuation")
	}
	return out
}

func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if len(ins) == 0 || ins[0].cmd != "FROM" || ins[0].args != "scratch" {
		t.Fatalf("first instruction %+v, want FROM scratch", ins)
	}
	known := map[string]bool{"FROM": true, "COPY": true, "USER": true, "EXPOSE": true, "ENTRYPOINT": true, "LABEL": true, "CMD": true, "WORKDIR": true, "ENV": true}
	var copySrc, copyDst, user string
	var entry []string
	var ports []string
	for _, in := range ins {
		switch {
		case in.cmd == "RUN":
			t.Errorf("Dockerfile:%d: RUN on scratch (no shell)", in.line)
		case !known[in.cmd]:
			t.Errorf("Dockerfile:%d: unknown instruction %s", in.line, in.cmd)
		case in.cmd == "COPY":
			f := strings.Fields(in.args)
			if len(f) != 2 {
				t.Fatalf("Dockerfile:%d: COPY %q, want one source and one destination", in.line, in.args)
			}
			copySrc, copyDst = f[0], f[1]
		case in.cmd == "USER":
			user = in.args
		case in.cmd == "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entry); err != nil || len(entry) == 0 {
				t.Fatalf("Dockerfile:%d: ENTRYPOINT %s is not the exec form (a JSON array): scratch has no shell", in.line, in.args)
			}
		case in.cmd == "EXPOSE":
			ports = append(ports, strings.Fields(in.args)...)
		}
	}
	cmds := makeCommands(t, "build-static")
	if !strings.Contains(strings.Join(cmds, " "), "-o "+copySrc+" ") {
		t.Errorf("COPY %s: make build-static writes %q", copySrc, cmds)
	}
	if len(entry) == 0 || entry[0] != copyDst {
		t.Errorf("ENTRYPOINT %v does not run the copied %s", entry, copyDst)
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric non-root user (scratch has no /etc/passwd)", user)
	}
	for _, p := range []string{"8000", "7400"} {
		if !slices.Contains(ports, p) {
			t.Errorf("EXPOSE %v lacks %s (deploy/ listens on it)", ports, p)
		}
	}
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, l := range strings.Split(string(ignore), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			rules = append(rules, l)
		}
	}
	if !slices.Equal(rules, []string{"*", "!" + copySrc}) {
		t.Errorf(".dockerignore rules %v, want the build context to hold %s only", rules, copySrc)
	}
}
