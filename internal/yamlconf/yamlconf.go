// Package yamlconf decodes tether's YAML configuration files (edge and
// worker) one way: over a struct that already holds the defaults, with
// unknown and duplicate keys refused, every value checked against the type
// of the field it fills, and every problem reported as
// "key.path, line N: message".
//
// Validators report through Problems, which places each finding at the
// line of its key (Doc.Line), so a file's validation errors read like its
// decoding errors. A field may name its former spelling in a `was` tag
// (`yaml:"creds_file" was:"creds"`): a document using it still decodes,
// and Doc.Deprecated says what to write instead.
//
// yaml.v3 parses the document into a yaml.Node tree; the tree is then
// walked beside the destination struct (fields found by their `yaml` tags),
// so the key path of every value is known where it is decoded. Leaf values
// are decoded by yaml.v3 itself (Node.Decode) after a check of their kind;
// types with their own decoder (yaml.Unmarshaler, encoding.TextUnmarshaler)
// get the node as it is. yaml.v3 decoding the whole document at once only
// reports a line, and stops at the first error of a custom decoder without
// even that.
package yamlconf

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrEmpty is returned by Decode for a document without content (an
// empty file, or only comments).
var ErrEmpty = errors.New("empty configuration")

// Error is one problem, at Path (dotted keys and [i] list indexes, ""
// for the whole document) on Line (0: unknown, or a key the document does
// not have).
type Error struct {
	Path string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	path := e.Path
	if path == "" {
		path = "configuration"
	}
	if e.Line > 0 {
		return fmt.Sprintf("%s, line %d: %s", path, e.Line, e.Msg)
	}
	return path + ": " + e.Msg
}

// Errors are every problem of one document, in document order.
type Errors []*Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Decode parses data (one YAML document) into out, a pointer to a struct
// holding the defaults: keys absent from the document, or present with no
// value ("key:"), keep them. A syntax error is "invalid YAML: line N: …";
// anything else is an Errors.
func Decode(data []byte, out any) error {
	_, err := DecodeDoc(data, out)
	return err
}

// Doc is what decoding learned of a document besides its values: the line
// of every key, and the deprecated spellings it used.
type Doc struct {
	lines map[string]int
	// Deprecated has one warning per former spelling of a key the
	// document used ("nats.creds, line 4: deprecated: write creds_file").
	Deprecated Errors
}

// Line is the line of path in the document, or of the nearest enclosing
// key it has (a key the document omits is reported where its section
// is); 0 when the document has neither, or d is nil.
func (d *Doc) Line(path string) int {
	if d == nil {
		return 0
	}
	for path != "" {
		if l, ok := d.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// Warnings are the deprecation warnings as text, one per former spelling
// the document used (none for a nil Doc: a configuration built in code).
func (d *Doc) Warnings() []string {
	if d == nil {
		return nil
	}
	out := make([]string, len(d.Deprecated))
	for i, e := range d.Deprecated {
		out[i] = e.Error()
	}
	return out
}

// DecodeDoc is Decode that also returns what it learned of the document
// (nil with an error that is not an Errors).
func DecodeDoc(data []byte, out any) (*Doc, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, syntaxError(data, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, ErrEmpty
	}
	d, err := decodeNode(doc.Content[0], out)
	if d == nil {
		return nil, err
	}
	return &Doc{lines: d.lines, Deprecated: d.deprecated}, err
}

// DecodeNode decodes n into out with Decode's rules; paths in its errors
// are relative to n. A type's own UnmarshalYAML may call it for the
// mapping form of its value: Decode then prefixes the paths with the
// value's own.
func DecodeNode(n *yaml.Node, out any) error {
	_, err := decodeNode(n, out)
	return err
}

func decodeNode(n *yaml.Node, out any) (*decoder, error) {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, fmt.Errorf("yamlconf: decode into %T, want a non-nil pointer", out)
	}
	if expandedSize(n, maxNodes, map[*yaml.Node]int{}) > maxNodes {
		return nil, Errors{{Line: n.Line, Msg: fmt.Sprintf("its aliases expand to more than %d values, or refer to themselves", maxNodes)}}
	}
	d := &decoder{lines: map[string]int{}}
	decode(n, v.Elem(), "", d)
	if d.dropped > 0 {
		d.errs = append(d.errs, &Error{Msg: fmt.Sprintf("%d more problems not shown", d.dropped)})
	}
	if len(d.errs) > 0 {
		return d, d.errs
	}
	return d, nil
}

// maxNodes bounds the nodes a document holds once its aliases are
// expanded: aliases can make a short document expand exponentially
// ("billion laughs"), and the decoder walks the expansion.
const maxNodes = 1 << 16

// expandedSize counts the nodes of n with every alias expanded, stopping
// past limit; each distinct node is sized once, so the count costs the
// document's own size.
func expandedSize(n *yaml.Node, limit int, memo map[*yaml.Node]int) int {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if size, ok := memo[n]; ok {
		return size
	}
	memo[n] = limit + 1 // an alias to a node being sized: a cycle
	size := 1
	for _, c := range n.Content {
		if size += expandedSize(c, limit, memo); size > limit {
			size = limit + 1
			break
		}
	}
	memo[n] = size
	return size
}

// maxErrors bounds the problems reported for one document: the first
// ones, then how many more there were.
const maxErrors = 20

// decoder collects the problems of one document.
type decoder struct {
	errs       Errors
	dropped    int
	lines      map[string]int // key path → line
	deprecated Errors
}

// recordTree notes the line of every key and list item below n, for a
// value a type's own decoder took whole.
func (d *decoder) recordTree(n *yaml.Node, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := joinPath(path, n.Content[i].Value)
			d.lines[key] = n.Content[i].Line
			d.recordTree(n.Content[i+1], key)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			key := fmt.Sprintf("%s[%d]", path, i)
			d.lines[key] = item.Line
			d.recordTree(item, key)
		}
	}
}

func (d *decoder) add(e *Error) {
	if len(d.errs) < maxErrors {
		d.errs = append(d.errs, e)
	} else {
		d.dropped++
	}
}

// syntaxError words a parse error of yaml.v3 ("yaml: line 3: found
// character that cannot start any token") and explains the usual cause of
// that one, a tab.
func syntaxError(data []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var line int
	if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil && line > 0 {
		lines := bytes.Split(data, []byte("\n"))
		if line <= len(lines) && bytes.ContainsRune(lines[line-1], '\t') {
			msg += " (a tab: YAML indents with spaces only)"
		}
	}
	return errors.New("invalid YAML: " + msg)
}

var (
	durationType        = reflect.TypeFor[time.Duration]()
	yamlUnmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decode fills v from n, adding every problem to d.
func decode(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // "key:" with no value keeps the default
	}
	bad := func(format string, args ...any) {
		d.add(&Error{Path: path, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
	}
	t := v.Type()
	pt := reflect.PointerTo(t)
	switch {
	case pt.Implements(yamlUnmarshalerType):
		decodeCustom(n, v, path, d)
	case pt.Implements(textUnmarshalerType):
		if n.Kind != yaml.ScalarNode {
			bad("want a string, got %s", describe(n))
			return
		}
		decodeCustom(n, v, path, d)
	case t == durationType:
		dur, err := time.ParseDuration(n.Value)
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || err != nil {
			bad("want %s, got %s", want(t), describe(n))
			return
		}
		v.SetInt(int64(dur))
	case t.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		decode(n, v.Elem(), path, d)
	case t.Kind() == reflect.Struct:
		decodeStruct(n, v, path, d)
	case t.Kind() == reflect.Slice:
		decodeSlice(n, v, path, d)
	case t.Kind() == reflect.Map:
		decodeMap(n, v, path, d)
	default:
		decodeScalar(n, v, bad)
	}
}

// decodeCustom runs a type's own decoder. Its message is kept (it says what
// is wrong: "unknown value …"); a "router.type: " prefix the path already
// ends with is dropped, and an Errors from a nested DecodeNode gets the
// path prefixed.
func decodeCustom(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	d.recordTree(n, path)
	err := n.Decode(v.Addr().Interface())
	if err == nil {
		return
	}
	var nested Errors
	if errors.As(err, &nested) {
		for _, e := range nested {
			d.add(&Error{Path: joinPath(path, e.Path), Line: e.Line, Msg: e.Msg})
		}
		return
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		d.add(&Error{Path: path, Line: n.Line, Msg: fmt.Sprintf("want %s, got %s", want(v.Type()), describe(n))})
		return
	}
	msg := err.Error()
	if k, rest, ok := strings.Cut(msg, ": "); ok && (path == k || strings.HasSuffix(path, "."+k)) {
		msg = rest
	}
	d.add(&Error{Path: path, Line: n.Line, Msg: msg})
}

// decodeStruct fills the fields of struct v from mapping n by their yaml
// tags; unknown and repeated keys are errors.
func decodeStruct(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	if n.Kind != yaml.MappingNode {
		d.add(&Error{Path: path, Line: n.Line, Msg: "want a mapping of keys, got " + describe(n)})
		return
	}
	// Merged mappings ("<<: *defaults") first: the keys given here win,
	// wherever they stand.
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].ShortTag() == "!!merge" {
			decodeMerge(n.Content[i+1], v, path, d)
		}
	}
	seen := map[string]*yaml.Node{} // by the key's current spelling
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			continue
		}
		key := joinPath(path, k.Value)
		f, name, ok := field(v, k.Value)
		if !ok {
			d.add(&Error{Path: key, Line: k.Line, Msg: "unknown key" + hint(k.Value, keys(v.Type()))})
			continue
		}
		if first, dup := seen[name]; dup {
			msg := fmt.Sprintf("duplicate key (first given on line %d)", first.Line)
			if first.Value != k.Value {
				msg = fmt.Sprintf("given twice, as %s on line %d and as %s (the same setting): keep %s", first.Value, first.Line, k.Value, name)
			}
			d.add(&Error{Path: key, Line: k.Line, Msg: msg})
			continue
		}
		seen[name] = k
		canonical := joinPath(path, name)
		d.lines[canonical] = k.Line
		if name != k.Value {
			d.deprecated = append(d.deprecated, &Error{Path: key, Line: k.Line,
				Msg: fmt.Sprintf("deprecated spelling: write %s (read the same way for now)", canonical)})
			if val.Kind == yaml.ScalarNode && f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String {
				// The former key took one string, or several
				// separated by commas, where the list now stands.
				setCommaList(val, f)
				continue
			}
		}
		decode(val, f, key, d) // a problem of the value is named as the file spells it
	}
}

// setCommaList fills string slice f from a scalar of comma-separated
// values.
func setCommaList(n *yaml.Node, f reflect.Value) {
	parts := strings.Split(n.Value, ",")
	s := reflect.MakeSlice(f.Type(), 0, len(parts))
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			s = reflect.Append(s, reflect.ValueOf(p).Convert(f.Type().Elem()))
		}
	}
	f.Set(s)
}

// decodeMerge fills struct v from the mapping (or list of mappings) of a
// merge key; of a list, earlier mappings win.
func decodeMerge(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.SequenceNode {
		decodeStruct(n, v, path, d)
		return
	}
	for i := len(n.Content) - 1; i >= 0; i-- {
		m := n.Content[i]
		if m.Kind == yaml.AliasNode && m.Alias != nil {
			m = m.Alias
		}
		decodeStruct(m, v, path, d)
	}
}

// field finds the field of struct v that key fills, by its name or its
// former spelling (`was` tag), looking into fields tagged ",inline"; name
// is the key's current spelling.
func field(v reflect.Value, key string) (f reflect.Value, name string, ok bool) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if opts == "inline" && sf.Type.Kind() == reflect.Struct {
			if f, name, ok := field(v.Field(i), key); ok {
				return f, name, true
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		if name == key || sf.Tag.Get("was") == key && key != "" {
			return v.Field(i), name, true
		}
	}
	return reflect.Value{}, "", false
}

// keys lists the keys struct type t takes, inlined structs' included.
func keys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		sf := t.Field(i)
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		switch {
		case !sf.IsExported() || name == "-":
		case opts == "inline" && sf.Type.Kind() == reflect.Struct:
			out = append(out, keys(sf.Type)...)
		case name == "":
			out = append(out, strings.ToLower(sf.Name))
		default:
			out = append(out, name)
		}
	}
	return out
}

// hint helps with an unknown key: the known key it is probably a typo of,
// or, in a small section, every key it takes.
func hint(key string, known []string) string {
	best, bestDist := "", 3 // at most two edits away
	for _, k := range known {
		if len(key) > 2*len(k)+2 {
			continue // too long to be a typo (and bounds the work)
		}
		if dist := editDistance(key, k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	switch {
	case best != "":
		return fmt.Sprintf(" (did you mean %s?)", best)
	case len(known) <= 8:
		return fmt.Sprintf(" (allowed: %s)", strings.Join(known, ", "))
	}
	return ""
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeSlice replaces slice v with the items of sequence n.
func decodeSlice(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	if n.Kind != yaml.SequenceNode {
		d.add(&Error{Path: path, Line: n.Line, Msg: fmt.Sprintf("want %s, got %s", want(v.Type()), describe(n))})
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		key := fmt.Sprintf("%s[%d]", path, i)
		d.lines[key] = item.Line
		decode(item, s.Index(i), key, d)
	}
	v.Set(s)
}

// decodeMap fills map v (string keys) from mapping n.
func decodeMap(n *yaml.Node, v reflect.Value, path string, d *decoder) {
	if n.Kind != yaml.MappingNode || v.Type().Key().Kind() != reflect.String {
		d.add(&Error{Path: path, Line: n.Line, Msg: "want a mapping of keys, got " + describe(n)})
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		key := joinPath(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.add(&Error{Path: key, Line: k.Line, Msg: fmt.Sprintf("duplicate key (first given on line %d)", first)})
			continue
		}
		seen[k.Value] = k.Line
		d.lines[key] = k.Line
		elem := reflect.New(v.Type().Elem()).Elem()
		decode(n.Content[i+1], elem, key, d)
		v.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
	}
}

// decodeScalar fills a string, number or bool. Strings take any scalar
// (port: 8000 under a string key is "8000"); an integer key refuses 1.5
// (yaml.v3 would truncate it) and a quoted "8000".
func decodeScalar(n *yaml.Node, v reflect.Value, bad func(string, ...any)) {
	t := v.Type()
	if n.Kind != yaml.ScalarNode {
		bad("want %s, got %s", want(t), describe(n))
		return
	}
	tag := n.ShortTag()
	switch t.Kind() {
	case reflect.String:
		v.SetString(n.Value)
		return
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if tag != "!!int" {
			bad("want %s, got %s", want(t), describe(n))
			return
		}
	case reflect.Float32, reflect.Float64:
		if tag != "!!int" && tag != "!!float" {
			bad("want %s, got %s", want(t), describe(n))
			return
		}
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		bad("want %s, got %s", want(t), describe(n))
	}
}

// want names what a value of type t looks like in YAML.
func want(t reflect.Type) string {
	switch {
	case t == durationType:
		return `a duration such as "100ms" or "2s"`
	case t.Kind() == reflect.String, t.Implements(textUnmarshalerType), reflect.PointerTo(t).Implements(textUnmarshalerType):
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "an integer"
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		return "a non-negative integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "a list of strings"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.Struct || t.Kind() == reflect.Map:
		return "a mapping of keys"
	}
	return "a " + t.String()
}

// describe names what the document holds at n.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func joinPath(path, key string) string {
	switch {
	case path == "":
		return key
	case key == "" || strings.HasPrefix(key, "["):
		return path + key
	}
	return path + "." + key
}
