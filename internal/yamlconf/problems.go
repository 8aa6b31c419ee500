package yamlconf

import (
	"errors"
	"fmt"
	"strings"
)

// Problems collects what a configuration's validators find, each problem
// at its key path and at the line of that key in the document it was
// decoded from (doc nil: a configuration built in code, no lines). One
// validator per section adds to the same Problems, so every problem of a
// file is reported at once, in the shape decoding reports its own.
type Problems struct {
	doc  *Doc
	errs Errors
}

// NewProblems returns an empty collector placing problems in doc.
func NewProblems(doc *Doc) *Problems { return &Problems{doc: doc} }

// Add records a problem of the setting at path.
func (p *Problems) Add(path, format string, args ...any) {
	p.errs = append(p.errs, &Error{Path: path, Line: p.doc.Line(path), Msg: fmt.Sprintf(format, args...)})
}

// AddError records the problems of err, an error from a package that
// words its problems as "key.path: message" (joined with errors.Join, or
// an Errors); prefix, when not "", is the path of the section err's paths
// are relative to. An error not of that shape is recorded at prefix.
func (p *Problems) AddError(prefix string, err error) {
	if err == nil {
		return
	}
	var es Errors
	if errors.As(err, &es) {
		for _, e := range es {
			p.Add(joinPath(prefix, e.Path), "%s", e.Msg)
		}
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			p.AddError(prefix, e)
		}
		return
	}
	msg := err.Error()
	if key, rest, ok := strings.Cut(msg, ": "); ok && isKeyPath(key) {
		p.Add(joinPath(prefix, key), "%s", rest)
		return
	}
	p.Add(prefix, "%s", msg)
}

// isKeyPath reports whether s looks like a key path (snake_case keys,
// dots, list indexes).
func isKeyPath(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '[' || c == ']') {
			return false
		}
	}
	return true
}

// Len is how many problems were recorded.
func (p *Problems) Len() int { return len(p.errs) }

// Err is the problems as an Errors, or nil when there are none.
func (p *Problems) Err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return p.errs
}
