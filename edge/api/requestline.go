package api

import (
	"bytes"
	"net/url"
	"strings"

	"github.com/tether-project/tether/internal/apireq"
)

// requestLines follows the bytes a connection delivers to the server and
// remembers the path of the last request line among them, so an answer
// written for a request net/http refused before any handler ran can take
// that path's API shape. net/http reads a request's header block (its
// request line first) only after the previous request's body, so the last
// request line read is the refused request's own.
//
// A request line ends its line, but need not start one: on a kept-alive
// connection it follows the previous request's body, which rarely ends in
// a newline. So each line's last lineTailBytes are kept (lines are found
// with bytes.IndexByte: a body costs a scan for newlines, nothing more)
// and read backwards from its version.
type requestLines struct {
	tail []byte // the current line's last bytes
	cut  bool   // the current line is longer than tail
	path string // the last request line's path ("" none, or one too long to be a dialect's)
}

// lineTailBytes bounds what is kept of a line: a method, a space, a target
// and the version, the target long enough for any dialect's path
// ("/v1/messages/count_tokens") with a query or an absolute form's scheme
// and host.
const lineTailBytes = 320

// feed takes the next bytes read from the connection.
func (s *requestLines) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if len(seg) >= lineTailBytes {
			s.cut = s.cut || len(s.tail) > 0 || len(seg) > lineTailBytes
			s.tail = append(s.tail[:0], seg[len(seg)-lineTailBytes:]...)
		} else {
			if over := len(s.tail) + len(seg) - lineTailBytes; over > 0 {
				s.tail, s.cut = append(s.tail[:0], s.tail[over:]...), true
			}
			s.tail = append(s.tail, seg...)
		}
		if i < 0 {
			return
		}
		if path, ok := parseRequestLine(s.tail, s.cut); ok {
			s.path = path
		}
		s.tail, s.cut = s.tail[:0], false
		p = p[i+1:]
	}
}

// dialect is the API whose shape an answer to the last request takes
// (Messages on its paths, OpenAI's Chat everywhere else), as PathDialect
// decides it for a request a handler sees.
func (s *requestLines) dialect() apireq.Dialect {
	if d, ok := DialectOfPath(s.path); ok {
		return d
	}
	return apireq.Chat
}

// parseRequestLine reads the path from the end of a line holding an
// HTTP/1.x request line ("POST /v1/messages?beta=true HTTP/1.1", perhaps
// after a previous body's last bytes): a version, before it a space and an
// origin-form or absolute-form target, before that a space and a method
// token (its last byte a capital letter). In a line cut to its tail (cut),
// a target that fills the tail is a request line with no dialect's path
// ("").
func parseRequestLine(line []byte, cut bool) (string, bool) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	v := bytes.LastIndex(line, []byte(" HTTP/"))
	if v < 0 || len(line)-v > len(" HTTP/1.1")+2 {
		return "", false
	}
	sp := bytes.LastIndexByte(line[:v], ' ')
	if sp < 0 {
		return "", cut
	}
	if sp == 0 || line[sp-1] < 'A' || line[sp-1] > 'Z' {
		return "", false
	}
	target := string(line[sp+1 : v])
	if !strings.HasPrefix(target, "/") {
		u, err := url.Parse(target)
		if err != nil || u.Host == "" {
			return "", false
		}
		target = u.RequestURI()
	}
	path, _, _ := strings.Cut(target, "?")
	return path, true
}
