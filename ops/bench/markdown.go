package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Generated sections of BENCHMARKS.md sit between these markers; everything
// outside them is hand-written and kept as is.
const (
	markerBegin = "<!-- tether-bench:begin %s -->"
	markerEnd   = "<!-- tether-bench:end %s -->"
)

// RewriteSections replaces the content between each named section's markers
// in the markdown file at path. A section whose markers are missing is an
// error naming it (the file's structure is hand-written; the harness does not
// guess where a section belongs).
func RewriteSections(path string, sections map[string]string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	out, err := ReplaceSections(string(data), sections)
	if err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(out), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// ReplaceSections is RewriteSections on a string.
func ReplaceSections(doc string, sections map[string]string) (string, error) {
	names := make([]string, 0, len(sections))
	for n := range sections {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		begin, end := fmt.Sprintf(markerBegin, name), fmt.Sprintf(markerEnd, name)
		i := strings.Index(doc, begin)
		j := strings.Index(doc, end)
		switch {
		case i < 0 || j < 0:
			return "", fmt.Errorf("section %q: markers %q and %q not found", name, begin, end)
		case j < i:
			return "", fmt.Errorf("section %q: end marker before begin marker", name)
		case strings.Count(doc, begin) > 1 || strings.Count(doc, end) > 1:
			return "", fmt.Errorf("section %q: markers appear more than once", name)
		}
		body := strings.TrimRight(sections[name], "\n")
		doc = doc[:i+len(begin)] + "\n" + body + "\n" + doc[j:]
	}
	return doc, nil
}

// MicroResult is one Go benchmark's figures (medians over its runs).
type MicroResult struct {
	Package string
	Name    string
	Runs    int
	// Metrics by unit ("ns/op", "B/op", "allocs/op", custom units).
	Metrics map[string]float64
	Units   []string // in first-seen order
}

// ParseGoBench reads `go test -bench` output (any -count) and returns one
// result per (package, benchmark) with the median of each metric.
func ParseGoBench(r io.Reader) ([]MicroResult, error) {
	type key struct{ pkg, name string }
	samples := map[key]map[string][]float64{}
	units := map[key][]string{}
	var order []key
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue // a benchmark's log line, not a result
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if k := strings.LastIndexByte(name, '-'); k > 0 {
			if _, err := strconv.Atoi(name[k+1:]); err == nil {
				name = name[:k] // GOMAXPROCS suffix
			}
		}
		k := key{pkg, name}
		if samples[k] == nil {
			samples[k] = map[string][]float64{}
			order = append(order, k)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			u := f[i+1]
			if _, seen := samples[k][u]; !seen {
				units[k] = append(units[k], u)
			}
			samples[k][u] = append(samples[k][u], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: read go test -bench output: %w", err)
	}
	out := make([]MicroResult, 0, len(order))
	for _, k := range order {
		m := MicroResult{Package: k.pkg, Name: k.name, Metrics: map[string]float64{}, Units: units[k]}
		for u, vs := range samples[k] {
			m.Metrics[u] = median(vs)
			m.Runs = max(m.Runs, len(vs))
		}
		out = append(out, m)
	}
	return out, nil
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MicroTable renders micro-benchmark results as a markdown table.
func MicroTable(results []MicroResult, module string) string {
	var b strings.Builder
	b.WriteString("| package | benchmark | runs | ns/op | B/op | allocs/op | other |\n|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range results {
		other := []string{}
		for _, u := range r.Units {
			if u == "ns/op" || u == "B/op" || u == "allocs/op" {
				continue
			}
			other = append(other, fmt.Sprintf("%s %s", num(r.Metrics[u]), u))
		}
		cell := func(u string) string {
			if v, ok := r.Metrics[u]; ok {
				return num(v)
			}
			return "—"
		}
		pkg := strings.TrimPrefix(strings.TrimPrefix(r.Package, module), "/")
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s |\n", pkg, r.Name, r.Runs, cell("ns/op"), cell("B/op"), cell("allocs/op"), strings.Join(other, ", "))
	}
	return b.String()
}

// num formats a figure with sensible precision.
func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000 || v == float64(int64(v)):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
